"""The "engine": the ranks that would hold the model, and the checks vLLM's executors make.

RayEngine follows vLLM's Ray executor (initialize_ray_cluster + RayDistributedExecutor):
ray.init() with no address (honours RAY_ADDRESS, else starts a private local Ray), GPU count check,
a PACK placement group of world_size {"GPU": 1} bundles whose first bundle is pinned to the driver's
IP via {"node:<ip>": 0.001}, one actor per bundle, then the driver-node and unique-IP checks.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any, Protocol

from vllm_standin.config import ServeConfig
from vllm_standin.model_files import SnapshotReport
from vllm_standin.worker import RankReport, RankWorker, detect_node_ip

logger = logging.getLogger("vllm_standin.engine")

DEVICE = "GPU"
PLACEMENT_LOG_INTERVAL_S = 5.0


class StartupError(RuntimeError):
    """The engine cannot start; the message is what the operator needs to fix it."""


class EngineDeadError(RuntimeError):
    """A rank stopped answering after start-up (vLLM: EngineDeadError)."""


class TerminationRequested(Exception):
    """SIGTERM/SIGINT arrived during start-up; start-up stops at its next check (within ~1 s)."""


class Engine(Protocol):
    ranks: list[RankReport]

    def start(self) -> None: ...

    def check_alive(self, timeout_s: float) -> None: ...

    def check_request(self, timeout_s: float) -> None: ...

    def shutdown(self) -> None: ...


def validate_ranks(ranks: list[RankReport], driver_snapshot: SnapshotReport) -> None:
    """Fail as a real worker would: missing weights, weights that differ (the files vLLM loads,
    not the rest of the snapshot), or a broken Gloo env."""
    for report in ranks:
        where = f"rank {report.rank} on node {report.node_ip} ({report.hostname})"
        snapshot = report.snapshot
        if not snapshot.usable:
            raise StartupError(
                f"Model weights not available on {where}: {snapshot.describe_problem()}. "
                "Real vLLM would fail loading weights on this worker; replicate the HF cache to "
                "every node (same path, symlinks preserved) and verify files and bytes."
            )
        if snapshot.weights != driver_snapshot.weights:
            theirs, ours = dict(snapshot.weights), dict(driver_snapshot.weights)
            differ = sorted(n for n in theirs.keys() | ours.keys() if theirs.get(n) != ours.get(n))
            shown = ", ".join(
                f"{n} ({theirs.get(n, 'missing')} vs {ours.get(n, 'missing')} bytes)"
                for n in differ[:3]
            )
            raise StartupError(
                f"Model weights on {where} differ from the driver's: {shown}. "
                "Real vLLM would fail loading weights."
            )
        # A one-rank group never connects a Gloo mesh, so only multi-rank groups can fail here.
        if report.gloo_problem and len(ranks) > 1:
            raise StartupError(f"RuntimeError on {where}: {report.gloo_problem}")


def log_ranks(ranks: list[RankReport]) -> None:
    for report in ranks:
        logger.info(
            "rank %d: node_ip=%s host_ip=%s hostname=%s pid=%d snapshot=%s files=%d bytes=%d "
            "NCCL_SOCKET_IFNAME=%s GLOO_SOCKET_IFNAME=%s api_key_carried=%s",
            report.rank,
            report.node_ip,
            report.host_ip,
            report.hostname,
            report.pid,
            report.snapshot.path,
            report.snapshot.file_count,
            report.snapshot.total_bytes,
            report.env.get("NCCL_SOCKET_IFNAME"),
            report.env.get("GLOO_SOCKET_IFNAME"),
            "yes" if report.holds_api_key else "no",
        )
    log_compile(ranks)


def log_compile(ranks: list[RankReport]) -> None:
    """vLLM's torch.compile lines (vllm/compilation/backends.py, monitor.py): per rank where the
    cache is, then from the cache or compiled, and the slowest rank's total."""
    for report in ranks:
        logger.info(
            "rank %d: Using cache directory: %s for vLLM's torch.compile",
            report.rank,
            report.compile_dir,
        )
        if report.compile_cached:
            logger.info(
                "rank %d: Directly load the compiled graph(s) for dynamic shape from the cache, "
                "took %.3f s",
                report.rank,
                report.compile_seconds,
            )
        else:
            logger.info(
                "rank %d: Compiling a graph for dynamic shape takes %.2f s",
                report.rank,
                report.compile_seconds,
            )
    if ranks:
        logger.info("torch.compile takes %.2f s in total", max(r.compile_seconds for r in ranks))


class SingleProcessEngine:
    """uni/mp backends: no Ray; on GPU-less lab hosts only world size 1 can work."""

    def __init__(self, config: ServeConfig, driver_snapshot: SnapshotReport) -> None:
        self.config = config
        self.driver_snapshot = driver_snapshot
        self.ranks: list[RankReport] = []

    def start(self) -> None:
        if self.config.world_size != 1:
            raise StartupError(
                f"distributed_executor_backend={self.config.executor_backend!r} needs "
                f"{self.config.world_size} local GPUs (tensor_parallel_size="
                f"{self.config.tensor_parallel_size} x pipeline_parallel_size="
                f"{self.config.pipeline_parallel_size}); the lab hosts have none. "
                "Use --distributed-executor-backend ray for multi-node serving."
            )
        worker = RankWorker(0, self.config.model, self.config.revision, self.config.compile_key)
        self.ranks = [worker.describe()]
        log_ranks(self.ranks)
        validate_ranks(self.ranks, self.driver_snapshot)

    def check_alive(self, timeout_s: float) -> None:
        return None

    def check_request(self, timeout_s: float) -> None:
        return None

    def shutdown(self) -> None:
        return None


class RayEngine:
    def __init__(
        self, config: ServeConfig, driver_snapshot: SnapshotReport, stop_requested: threading.Event
    ) -> None:
        self.config = config
        self.driver_snapshot = driver_snapshot
        # Set by the signal handler. Handlers must not raise: an exception raised while Ray's
        # C++ code waits comes back as SystemError, so waits are sliced and check this instead.
        self.stop_requested = stop_requested
        self.ranks: list[RankReport] = []
        self.actors: list[Any] = []
        self.placement_group: Any = None

    def start(self) -> None:
        import ray

        if not os.environ.get("RAY_ADDRESS"):
            logger.warning(
                "RAY_ADDRESS is not set: ray.init() will start a private local Ray instance "
                "instead of joining the cluster."
            )
        # ray.init() installs its own SIGTERM handler (logs a stack, exits 1); keep the caller's
        # so that `docker stop` during a long placement wait is an orderly, prompt exit.
        callers_sigterm = signal.getsignal(signal.SIGTERM)
        try:
            ray.init()
        except Exception as error:  # Ray raises ConnectionError, RuntimeError, ...
            raise StartupError(
                f"Cannot join the Ray cluster (RAY_ADDRESS={os.environ.get('RAY_ADDRESS')!r}): "
                f"{describe_error_chain(error)}.{local_raylet_hint()}"
            ) from None
        finally:
            signal.signal(signal.SIGTERM, callers_sigterm)
        self.raise_if_stopping()
        self.check_cluster_has_enough_gpus()
        driver_ip = os.environ.get("VLLM_HOST_IP") or detect_node_ip()
        self.check_driver_node_has_gpu(driver_ip)
        self.placement_group = self.create_placement_group(driver_ip)
        self.wait_for_placement_group(driver_ip)
        self.actors = self.start_rank_actors()
        self.ranks = self.describe_ranks()
        log_ranks(self.ranks)
        check_driver_and_unique_ips(self.ranks, driver_ip)
        validate_ranks(self.ranks, self.driver_snapshot)

    def raise_if_stopping(self) -> None:
        if self.stop_requested.is_set():
            raise TerminationRequested("termination requested during start-up")

    def check_cluster_has_enough_gpus(self) -> None:
        import ray

        available = ray.cluster_resources().get(DEVICE, 0)
        if self.config.world_size > available:
            raise StartupError(
                f"ValueError: The number of required {DEVICE}s exceeds the total number of "
                f"available {DEVICE}s in the placement group. (world_size={self.config.world_size}"
                f" = tensor_parallel_size {self.config.tensor_parallel_size} x "
                f"pipeline_parallel_size {self.config.pipeline_parallel_size}; the Ray cluster "
                f"declares {available:g} {DEVICE}s; cluster resources: "
                f"{ray.cluster_resources()}; alive node IPs: {alive_node_ips()})"
            )

    def check_driver_node_has_gpu(self, driver_ip: str) -> None:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
        resources = (node or {}).get("Resources", {})
        if resources.get(DEVICE, 0) < 1:
            raise StartupError(
                f"ValueError: Current node has no {DEVICE} available. {resources=}. vLLM engine "
                f"cannot start without {DEVICE}. Make sure you have at least 1 {DEVICE} available "
                f"in a node current_node_id={node_id!r} current_ip={driver_ip!r}."
            )

    def bundle_specs(self, driver_ip: str) -> list[dict[str, float]]:
        specs: list[dict[str, float]] = [{DEVICE: 1.0} for _ in range(self.config.world_size)]
        # vLLM pins the first bundle to the driver's node: the engine process is rank 0.
        specs[0][f"node:{driver_ip}"] = 0.001
        return specs

    def create_placement_group(self, driver_ip: str) -> Any:
        from ray.util import placement_group

        return placement_group(self.bundle_specs(driver_ip), strategy="PACK")

    def wait_for_placement_group(self, driver_ip: str) -> None:
        import ray

        started = time.monotonic()
        ready_ref = self.placement_group.ready()
        next_log = started + PLACEMENT_LOG_INTERVAL_S
        while True:
            elapsed = time.monotonic() - started
            remaining = self.config.placement_timeout_s - elapsed
            if remaining <= 0:
                break
            ready, _ = ray.wait([ready_ref], timeout=min(1.0, remaining))
            self.raise_if_stopping()
            if ready:
                logger.info("Placement group ready after %.1f s", time.monotonic() - started)
                return
            if time.monotonic() >= next_log:
                next_log += PLACEMENT_LOG_INTERVAL_S
                logger.info(
                    "Waiting for creating a placement group of specs for %d seconds. specs=%s. "
                    "Check `ray status` and `ray list nodes` to see if you have enough "
                    "resources, and make sure the IP addresses used by ray cluster are the "
                    "same as VLLM_HOST_IP environment variable specified in each node if you "
                    "are running on a multi-node.",
                    int(time.monotonic() - started),
                    self.placement_group.bundle_specs,
                )
        ray.util.remove_placement_group(self.placement_group)
        raise StartupError(self.placement_failure_message(driver_ip))

    def placement_failure_message(self, driver_ip: str) -> str:
        import ray

        specs = self.bundle_specs(driver_ip)
        node_ips = alive_node_ips()
        lines = [
            f"ValueError: Cannot provide a placement group of placement_group_specs={specs} "
            f"within {self.config.placement_timeout_s:g} seconds.",
            f"world_size={self.config.world_size}; driver IP (VLLM_HOST_IP or detected)="
            f"{driver_ip}; cluster resources: {ray.cluster_resources()}; "
            f"available: {ray.available_resources()}; alive node IPs: {node_ips}.",
        ]
        if driver_ip not in node_ips:
            lines.append(
                f"No available node types can fulfill resource request {specs[0]}: "
                f"'node:{driver_ip}' is not the IP of any Ray node. Set VLLM_HOST_IP on the "
                "driver to its node's Ray IP (--node-ip-address / RAY_NODE_IP_ADDRESS)."
            )
        lines.append("See `ray status` and `ray list nodes`.")
        return " ".join(lines)

    def start_rank_actors(self) -> list[Any]:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_class = ray.remote(num_cpus=0, num_gpus=1)(RankWorker)
        actors = []
        for rank in range(self.config.world_size):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=rank,
                placement_group_capture_child_tasks=True,
            )
            actors.append(
                actor_class.options(
                    scheduling_strategy=strategy,
                    runtime_env={"env_vars": carried_env_vars()},
                ).remote(rank, self.config.model, self.config.revision, self.config.compile_key)
            )
        return actors

    def describe_ranks(self) -> list[RankReport]:
        import ray

        refs = [actor.describe.remote() for actor in self.actors]
        deadline = time.monotonic() + self.config.worker_start_timeout_s
        while time.monotonic() < deadline:
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=1.0)
            self.raise_if_stopping()
            if not pending:
                return list(ray.get(refs))
        raise StartupError(
            f"Ray workers did not start within {self.config.worker_start_timeout_s:g} s "
            f"(VLLM_STANDIN_WORKER_START_TIMEOUT); alive node IPs: {alive_node_ips()}"
        )

    def check_alive(self, timeout_s: float) -> None:
        import ray

        for report, actor in zip(self.ranks, self.actors, strict=True):
            try:
                ray.get(actor.ping.remote(), timeout=timeout_s)
            except Exception as error:
                raise EngineDeadError(
                    f"EngineDeadError: Engine loop is not running: worker rank {report.rank} on "
                    f"node {report.node_ip} ({report.hostname}) did not answer within "
                    f"{timeout_s:g} s: {type(error).__name__}: {error}"
                ) from error

    def check_request(self, timeout_s: float) -> None:
        self.check_alive(timeout_s)

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def describe_error_chain(error: BaseException) -> str:
    """The error and its causes, one clause each: Ray's top-level message hides the cause."""
    clauses = []
    current: BaseException | None = error
    while current is not None and len(clauses) < 4:
        first_line = (str(current).strip().splitlines() or [""])[0][:500]
        clauses.append(f"{type(current).__name__}: {first_line}")
        current = current.__cause__ or current.__context__
    return " <- ".join(clauses)


def local_raylet_hint() -> str:
    """Ray drivers find their node's raylet by scanning local processes (ray 2.5x+)."""
    try:
        from ray._private.services import find_node_ids

        if find_node_ids():
            return ""
    except Exception:  # a private Ray API: no hint rather than a second failure
        return ""
    return (
        " No raylet process is visible from this process: a Ray driver looks for its node's "
        "raylet among local processes, so it must share the PID namespace of the node's Ray "
        "container (e.g. run inside it, or docker --pid=container:<ray container>) as well as "
        "its /tmp/ray."
    )


def alive_node_ips() -> list[str]:
    import ray

    return sorted(n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive"))


def check_driver_and_unique_ips(ranks: list[RankReport], driver_ip: str) -> None:
    """The two IP checks of vLLM's RayDistributedExecutor after its workers start."""
    worker_ips = [report.host_ip for report in ranks]
    if driver_ip not in worker_ips:
        raise StartupError(
            "ValueError: Ray does not allocate any GPUs on the driver node. "
            f"Driver IP: {driver_ip}, worker IPs: {worker_ips}. Consider adjusting the Ray "
            "placement group or running the driver on a GPU node."
        )
    nodes = {report.node_id for report in ranks}
    unique_ips = sorted(set(worker_ips))
    if len(nodes) != len(unique_ips):
        raise StartupError(
            f"RuntimeError: Every node should have a unique IP address. Got {len(nodes)} nodes "
            f"with node ids {sorted(nodes)} and {len(unique_ips)} unique IP addresses "
            f"{unique_ips}. Please check your network configuration. If you set `VLLM_HOST_IP` "
            "environment variable, make sure it is unique for each node."
        )


def build_engine(
    config: ServeConfig, driver_snapshot: SnapshotReport, stop_requested: threading.Event
) -> Engine:
    if config.executor_backend == "ray":
        return RayEngine(config, driver_snapshot, stop_requested)
    if config.executor_backend == "mp" and config.nnodes > 1:
        from vllm_standin.multinode import MultiNodeEngine

        return MultiNodeEngine(config, driver_snapshot, stop_requested)
    if config.executor_backend == "external_launcher":
        raise StartupError(
            "distributed_executor_backend='external_launcher' is for torchrun-launched offline "
            "inference and is not supported by `vllm serve` in the lab stand-in."
        )
    return SingleProcessEngine(config, driver_snapshot)


# Set per worker by vLLM itself, never copied from the driver (RayDistributedExecutor).
WORKER_SPECIFIC_ENV_VARS = frozenset(
    {"VLLM_HOST_IP", "VLLM_HOST_PORT", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"}
)


def non_carry_over_env_vars() -> set[str]:
    """vLLM's RAY_NON_CARRY_OVER_ENV_VARS: names listed in
    `<VLLM_CONFIG_ROOT>/ray_non_carry_over_env_vars.json` (vllm/ray/ray_env.py)."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    root = os.path.expanduser(
        os.environ.get("VLLM_CONFIG_ROOT") or os.path.join(config_home, "vllm")
    )
    try:
        with open(os.path.join(root, "ray_non_carry_over_env_vars.json")) as listed:
            return set(json.load(listed))
    except (OSError, ValueError):
        return set()


def carried_env_vars() -> dict[str, str]:
    """What vLLM's Ray executor copies from the driver to each worker's runtime env
    (vllm/ray/ray_env.py get_env_vars_to_copy): its VLLM_* variables, less the worker-specific
    ones and those the non-carry-over file lists."""
    excluded = WORKER_SPECIFIC_ENV_VARS | non_carry_over_env_vars()
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith("VLLM_") and name not in excluded
    }
