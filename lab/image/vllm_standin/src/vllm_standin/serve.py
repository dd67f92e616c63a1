"""`vllm serve`: start the engine, then serve until SIGTERM or until a rank dies."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import types

from vllm_standin import BANNER, VERSION
from vllm_standin.config import ServeConfig
from vllm_standin.engine import (
    Engine,
    EngineDeadError,
    StartupError,
    TerminationRequested,
    build_engine,
)
from vllm_standin.http_api import ServerState, StandinServer
from vllm_standin.metrics import KV_CACHE_SEQUENCES
from vllm_standin.model_files import (
    kv_bytes_per_token,
    measure_snapshot,
    read_max_position_embeddings,
)
from vllm_standin.multinode import run_headless, validate_multinode
from vllm_standin.openai_api import ServedModel

GIB = 1024**3

logger = logging.getLogger("vllm_standin.api_server")
DEFAULT_MAX_MODEL_LEN = 4096
RAY_SHUTDOWN_GRACE_S = 3.0


STOP_REQUESTED = threading.Event()  # set by SIGTERM/SIGINT; every wait in this process polls it
STOP_POLL_S = 0.2


def request_termination(signum: int, frame: types.FrameType | None) -> None:
    logger.info("Received %s, shutting down.", signal.Signals(signum).name)
    STOP_REQUESTED.set()


def install_signal_handlers() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_termination)


def configure_logging() -> None:
    vllm_style = logging.Formatter(
        "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S"
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(vllm_style)
    standin = logging.getLogger("vllm_standin")
    standin.addHandler(handler)
    standin.setLevel(logging.INFO)
    standin.propagate = False
    uvicorn_handler = logging.StreamHandler(sys.stdout)
    uvicorn_handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    for name in ("uvicorn", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers = [uvicorn_handler]
        uvicorn_logger.setLevel(logging.INFO)
        uvicorn_logger.propagate = False


def resolve_max_model_len(config: ServeConfig, snapshot_path: str | None) -> int:
    """vLLM derives the limit from config.json and refuses a larger --max-model-len."""
    derived = read_max_position_embeddings(snapshot_path) if snapshot_path else None
    if config.max_model_len is None:
        return derived or DEFAULT_MAX_MODEL_LEN
    allow_longer = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") in ("1", "true", "True")
    if derived is not None and config.max_model_len > derived and not allow_longer:
        raise StartupError(
            f"ValueError: User-specified max_model_len ({config.max_model_len}) is greater than "
            f"the derived max_model_len (max_position_embeddings={derived} in model's "
            "config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    return config.max_model_len


def start_engine(config: ServeConfig) -> tuple[Engine, int]:
    # The API server process reads the model config itself, so it needs the snapshot too.
    driver_snapshot = measure_snapshot(config.model, config.revision)
    if not driver_snapshot.usable:
        raise StartupError(
            f"OSError: cannot load the model on the API server node: "
            f"{driver_snapshot.describe_problem()} (HF_HOME={os.environ.get('HF_HOME')}, "
            f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')})"
        )
    max_model_len = resolve_max_model_len(config, driver_snapshot.path)
    logger.info("Using max model len %d", max_model_len)
    started = time.monotonic()
    engine = build_engine(config, driver_snapshot, STOP_REQUESTED)
    engine.start()
    load_weights_like_vllm(driver_snapshot.path)
    if config.kv_cache_memory_bytes is not None and driver_snapshot.path:
        check_kv_cache_like_vllm(config, driver_snapshot.path, max_model_len)
    else:
        # vLLM logs the KV cache its profiling found (kv_cache_utils.py); the stand-in's holds
        # KV_CACHE_SEQUENCES sequences of the maximum length (metrics.py).
        log_kv_cache_size(KV_CACHE_SEQUENCES * max_model_len, max_model_len)
    # vLLM's own figure for the engine's start (v1/engine/core.py), compile included.
    logger.info(
        "init engine (profile, create kv cache, warmup model) took %.2f seconds",
        time.monotonic() - started,
    )
    return engine, max_model_len


def load_weights_like_vllm(snapshot_path: str | None) -> None:
    """The progress lines vLLM logs while its ranks load the weights and capture CUDA graphs
    (tqdm bars, then timings), over VLLM_STANDIN_LOAD_SECONDS (default 0): what spark-vllm's
    readiness wait reports from the log while a real server loads for minutes."""
    seconds = float(os.environ.get("VLLM_STANDIN_LOAD_SECONDS", "0") or 0)
    shards = sorted(
        name
        for name in (os.listdir(snapshot_path) if snapshot_path else [])
        if name.endswith((".safetensors", ".bin"))
    )
    total = max(len(shards), 1)
    started = time.monotonic()
    bar = "Loading safetensors checkpoint shards: %3d%% Completed | %d/%d"
    print(bar % (0, 0, total), file=sys.stderr, flush=True)
    for done in range(1, total + 1):
        if STOP_REQUESTED.wait(seconds / (total + 1)):
            raise TerminationRequested()
        print(bar % (100 * done // total, done, total), file=sys.stderr, flush=True)
    logger.info("Loading weights took %.2f seconds", time.monotonic() - started)
    print("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%", file=sys.stderr)
    if STOP_REQUESTED.wait(seconds / (total + 1)):
        raise TerminationRequested()
    logger.info("Graph capturing finished in %.0f secs", seconds / (total + 1))


def check_kv_cache_like_vllm(config: ServeConfig, snapshot_path: str, max_model_len: int) -> None:
    """--kv-cache-memory-bytes as vLLM takes it (v1/worker/gpu_worker.py determine_available_memory,
    v1/core/kv_cache_utils.py check_enough_kv_cache_memory): the bytes as given, what they hold in
    tokens for the model's attention layers, and a refusal when one request of the maximum
    length does not fit. Full attention only (the lab's models)."""
    kv_bytes = config.kv_cache_memory_bytes or 0
    per_token = kv_bytes_per_token(snapshot_path, config.tensor_parallel_size)
    logger.info(
        "Reserved %.2f GiB memory for KV Cache as specified by kv_cache_memory_bytes config and "
        "skipped memory profiling. This does not respect the gpu_memory_utilization config. "
        "Only use kv_cache_memory_bytes config when you want manual control of KV cache memory "
        "size.",
        kv_bytes / GIB,
    )
    needed = per_token * max_model_len
    if kv_bytes < needed:
        raise StartupError(
            "ValueError: To serve at least one request with the models's max seq len "
            f"({max_model_len}), ({needed / GIB:.2f} GiB KV cache is needed, which is larger "
            f"than the available KV cache memory ({kv_bytes / GIB:.2f} GiB). Based on the "
            f"available memory, the estimated maximum model length is {kv_bytes // per_token}. "
            "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine."
        )
    # The cache is whole blocks (v1/core/kv_cache_utils.py: num_blocks = available // the
    # block's bytes), and vLLM reports num_blocks x block_size tokens.
    blocks = kv_bytes // (per_token * KV_BLOCK_TOKENS)
    log_kv_cache_size(blocks * KV_BLOCK_TOKENS, max_model_len)


# vLLM's default block size before 0.34 (the stand-in's version is older than any release).
KV_BLOCK_TOKENS = 16


def log_kv_cache_size(tokens: int, max_model_len: int) -> None:
    logger.info("GPU KV cache size: %s tokens", f"{tokens:,}")
    logger.info(
        "Maximum concurrency for %s tokens per request: %.2fx",
        f"{max_model_len:,}",
        tokens / max_model_len,
    )


def bind_server(config: ServeConfig) -> StandinServer:
    """Claim the port before the slow engine start-up, as vLLM does; a busy port fails fast."""
    try:
        return StandinServer((config.host or "", config.port))
    except OSError as error:
        raise StartupError(
            f"OSError: cannot bind {config.host or '0.0.0.0'}:{config.port}: {error}"
        ) from None


def serve_until_stopped(
    config: ServeConfig, engine: Engine, state: ServerState, server: StandinServer
) -> int:
    server.state = state
    server.server_activate()
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    # vLLM 0.32's line (vllm/entrypoints/.../entry.py); older releases said "API server 0".
    logger.info("Starting vLLM server on http://%s:%d", config.host or "0.0.0.0", config.port)
    uvicorn = logging.getLogger("uvicorn")
    uvicorn.info("Started server process [%d]", os.getpid())
    uvicorn.info("Waiting for application startup.")
    uvicorn.info("Application startup complete.")
    next_check = time.monotonic() + config.health_interval_s
    while not state.engine_dead.is_set():
        if STOP_REQUESTED.wait(STOP_POLL_S):
            return 0
        if time.monotonic() < next_check:
            continue
        try:
            engine.check_alive(config.health_timeout_s)
        except EngineDeadError as error:
            state.mark_dead(str(error))
        next_check = time.monotonic() + config.health_interval_s
    logger.error("%s", state.dead_reason)
    logger.error("Engine is dead; the API server exits so that its container stops.")
    return 1


def shutdown_quietly(engine: Engine | None, server: StandinServer | None) -> None:
    """Bounded cleanup: a hung Ray disconnect must not keep a stopping container alive."""
    if server is not None:
        server.server_close()
    if engine is not None:
        closer = threading.Thread(target=engine.shutdown, daemon=True)
        closer.start()
        closer.join(RAY_SHUTDOWN_GRACE_S)


def serving_state(config: ServeConfig, engine: Engine, max_model_len: int) -> ServerState:
    rank_ips = tuple(report.node_ip for report in engine.ranks)
    served = ServedModel(
        config.model, config.served_model_names, max_model_len, rank_ips, int(time.time())
    )
    return ServerState(
        served,
        config.api_key,
        config.access_log,
        lambda: engine.check_request(config.health_timeout_s),
    )


def run_serve(config: ServeConfig) -> int:
    configure_logging()
    install_signal_handlers()
    logger.info("%s", BANNER)
    logger.info("vLLM API server version %s", VERSION)
    logger.info("non-default args: %s", config.non_default_args)
    engine: Engine | None = None
    server: StandinServer | None = None
    exit_code = 1
    try:
        validate_multinode(config)
        if config.headless:
            exit_code = run_headless(config, STOP_REQUESTED)
        else:
            server = bind_server(config)
            engine, max_model_len = start_engine(config)
            exit_code = serve_until_stopped(
                config, engine, serving_state(config, engine, max_model_len), server
            )
    except StartupError as error:
        logger.error("%s", error)
        logger.error("Engine core initialization failed. See root cause above.")
        exit_code = 1
    except TerminationRequested:
        exit_code = 0
    finally:
        shutdown_quietly(engine, server)
        sys.stdout.flush()
        sys.stderr.flush()
    # os._exit: Ray's atexit hooks can block for seconds; a stopping container must not wait.
    os._exit(exit_code)
