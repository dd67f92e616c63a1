"""The stand-in held to real vLLM: both run side by side on this machine's loopback with the same
command line and the same tiny real model, and answer the same requests; what the program
depends on is compared.

Real vLLM is the lab's real image's own venv (vLLM's CPU build, lab/image.py REAL_VLLM), kept
beside its tarball in the lab's cache and run here directly (its Python is this machine's
/usr/bin/python3). Compared: the flags accepted and refused (and the image check's flag test,
components/scripts/image_facts.py, run against real `vllm serve --help`), the start-up lines the
readiness wait reads, the HTTP status and body of errors, the `/metrics` families the shipped
dashboards query and their labels (and every dashboard query answered by a real Prometheus
scraping real vLLM), the keys of `vllm bench serve`'s result that bench_summary.py reads, and a
headless rank whose rendezvous is missing; and which files of a snapshot vLLM loads as weights.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import hfmodel, image
from lab.core import missing_prerequisites
from lab.spec import DEFAULT_CACHE_DIR
from tests.weight_files import SHAPES, write_snapshot

from .conftest import unavailable
from .helpers import TINY_MODEL, StandinProcess, clean_env, free_port, http
from .test_bench_serve import bench
from .test_metrics import Prometheus, dashboard_queries

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "components" / "scripts"
KEY = "conformance-key-5b0e7d21c9a4"
SERVED = "tiny"
MAX_MODEL_LEN = 512
# What the program passes to `vllm serve` (stacks/plan/arguments.py vllm_serve_args), on one node,
# and what the lab's real vLLM needs on a CPU (lab/stack.py real_vllm_settings): one line for
# both servers.
SERVE_ARGS = (
    "--served-model-name", SERVED, "--revision", "main",
    "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
    "--distributed-executor-backend", "mp", "--gpu-memory-utilization", "0.5",
    "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--enforce-eager",
    "--api-key", KEY,
)  # fmt: skip
# Flags the program sets in some deployment (vllm_serve_args with executor mp on several nodes,
# vllm.kvCache): both must take every one.
PROGRAM_FLAGS = {
    "--served-model-name", "--revision", "--host", "--port", "--tensor-parallel-size",
    "--pipeline-parallel-size", "--distributed-executor-backend", "--gpu-memory-utilization",
    "--kv-cache-memory-bytes", "--nnodes", "--node-rank", "--master-addr", "--master-port",
    "--headless", "--max-model-len", "--api-key",
}  # fmt: skip
# The readiness wait's progress lines (components/scripts/vllm-ready.sh PROGRESS), each apart.
PROGRESS = re.search(r"^PROGRESS='([^']+)'", (SCRIPTS / "vllm-ready.sh").read_text(), re.MULTILINE)
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")
# A sample line of /metrics: its family (suffixes aside), then its labels.
SAMPLE = re.compile(r"^(vllm:[a-z0-9_:]+?)(_total|_bucket|_count|_sum|_created)?\{(.*)\} ")


@dataclass(frozen=True)
class RealVllm:
    bin: Path
    model: Path


@pytest.fixture(scope="module")
def real_vllm() -> RealVllm:
    """The real image's venv and model, built into the lab's cache if missing (lab/image.py)."""
    missing = [m for m in missing_prerequisites() if m.startswith(("tool dpkg", "tool ldd"))]
    if missing:
        unavailable(f"the real vLLM image cannot be built here: {missing}")
    tarball, _ = image.rootfs_tarball(DEFAULT_CACHE_DIR, "real")
    return RealVllm(image.venv_dir(tarball) / "bin", image.model_dir(tarball))


@pytest.fixture(scope="module")
def hf_home(real_vllm: RealVllm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf-conformance")
    hfmodel.seed_cache(home, TINY_MODEL, real_model=real_vllm.model)
    return home


def environment(bin_dir: Path, hf_home: Path) -> dict[str, str]:
    env = clean_env(bin_dir, hf_home)
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # lab/stack.py real_vllm_settings
    env["VLLM_CACHE_ROOT"] = str(hf_home.with_name(hf_home.name + "-vllm-cache"))
    return env


def serve(bin_dir: Path, hf_home: Path, log: Path, *args: str) -> StandinProcess:
    port = free_port()
    argv = [str(bin_dir / "vllm"), "serve", TINY_MODEL, "--host", "127.0.0.1", "--port",
            str(port), *args]  # fmt: skip
    return StandinProcess(argv, environment(bin_dir, hf_home), log, port).start()


@dataclass
class Pair:
    real: StandinProcess
    standin: StandinProcess

    def both(self) -> tuple[tuple[str, StandinProcess], ...]:
        return (("real", self.real), ("standin", self.standin))


@pytest.fixture(scope="module")
def pair(
    real_vllm: RealVllm,
    standin_bin: Path,
    hf_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pair]:
    """Both servers, the same command line and model, each answered a few requests."""
    logs = tmp_path_factory.mktemp("conformance")
    servers = Pair(
        serve(real_vllm.bin, hf_home, logs / "real.log", *SERVE_ARGS),
        serve(standin_bin, hf_home, logs / "standin.log", *SERVE_ARGS),
    )
    try:
        for _, server in servers.both():
            server.wait_ready(timeout_s=300)
            for turn in range(3):
                body = {"model": SERVED, "prompt": f"hello {turn}", "max_tokens": 8}
                status, reply = http("POST", server.base_url + "/v1/completions", body, KEY)
                assert status == 200, reply[:500]
        yield servers
    finally:
        for _, server in servers.both():
            server.stop()


def run_cli(bin_dir: Path, hf_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "vllm"), *args], capture_output=True, text=True,
                          timeout=240, env=environment(bin_dir, hf_home))  # fmt: skip


def help_flags(bin_dir: Path, hf_home: Path) -> set[str]:
    """Every flag `vllm serve` lists (vLLM groups its help: `--help=all` lists them all)."""
    for form in ("--help=all", "--help"):
        done = run_cli(bin_dir, hf_home, "serve", form)
        if done.returncode == 0 and len(FLAG.findall(done.stdout)) > 5:
            return set(FLAG.findall(done.stdout))
    raise AssertionError(f"{bin_dir}: vllm serve lists no flags")


def test_the_standin_takes_only_flags_real_vllm_takes(
    real_vllm: RealVllm, standin_bin: Path, hf_home: Path
) -> None:
    real = help_flags(real_vllm.bin, hf_home)
    standin = help_flags(standin_bin, hf_home)
    assert real >= PROGRAM_FLAGS, PROGRAM_FLAGS - real
    assert standin >= PROGRAM_FLAGS, PROGRAM_FLAGS - standin
    # `--help`, `--version` and the like are the CLI's own; every other flag the stand-in takes
    # vLLM takes too (a flag only the stand-in knew would pass the lab and fail on users' hosts).
    assert standin - real <= {"--help", "--version"}, sorted(standin - real)


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (("--not-a-vllm-flag", "1"), 2, "unrecognized arguments: --not-a-vllm-flag"),
        (("--dtype", "float64"), 2, "invalid choice: 'float64'"),
        # No choices in vLLM's parser for it: its config's validation refuses it at start.
        (("--distributed-executor-backend", "x"), 1, "1 validation error for VllmConfig"),
    ],
)
def test_refused_flags_fail_alike(
    real_vllm: RealVllm,
    standin_bin: Path,
    hf_home: Path,
    args: tuple[str, ...],
    exit_code: int,
    message: str,
) -> None:
    for bin_dir in (real_vllm.bin, standin_bin):
        done = run_cli(bin_dir, hf_home, "serve", TINY_MODEL, *args)
        assert done.returncode == exit_code, (bin_dir, done.stderr[-2000:])
        assert message in done.stderr, (bin_dir, done.stderr[-2000:])


def test_the_image_check_reads_real_vllms_flags(real_vllm: RealVllm, hf_home: Path) -> None:
    """components/scripts/image_facts.py as the image check runs it inside the real image: a
    flag vLLM lacks is named, with the nearest real one; a real one passes."""
    env = environment(real_vllm.bin, hf_home)
    check = [str(real_vllm.bin / "python3"), str(SCRIPTS / "image_facts.py")]

    def facts(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*check, json.dumps(list(extra)), "yes", "mp", "yes"],
                              capture_output=True, text=True, timeout=300, env=env)  # fmt: skip

    refused = facts("--max-num-seq", "4")
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert "--max-num-seq" in refused.stderr and "--max-num-seqs" in refused.stderr
    accepted = facts("--max-num-seqs", "4", "--dtype", "float32")
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    line = accepted.stdout.strip().splitlines()[-1]
    assert json.loads(line.removeprefix("spark-vllm-image-facts "))["vllm"].startswith("0.32.0")


def test_the_readiness_waits_progress_lines_are_in_both_logs(pair: Pair) -> None:
    assert PROGRESS, "vllm-ready.sh has no PROGRESS pattern"
    found = {}
    for name, server in pair.both():
        log = server.log
        found[name] = {p for p in PROGRESS.group(1).split("|") if re.search(p, log)}
    for line in ("Starting vLLM server on", "Application startup complete"):
        assert line in found["real"] and line in found["standin"], found
    # What real vLLM logs on one node the stand-in logs too (the lines only a multi-node or
    # GPU start prints are neither's here).
    assert found["real"] <= found["standin"], found["real"] - found["standin"]


def error_shape(body: bytes) -> object:
    """The JSON structure of an error body: its keys, nested, and its scalars' types."""
    value = json.loads(body)

    def shape(item: object) -> object:
        if isinstance(item, dict):
            return {key: shape(inner) for key, inner in sorted(item.items())}
        return type(item).__name__

    return shape(value)


def test_errors_have_vllms_status_and_body(pair: Pair) -> None:
    requests = {
        "no key": ("GET", "/v1/models", None, None),
        "wrong key": ("POST", "/v1/completions", {"model": SERVED, "prompt": "x"}, "nope"),
        "unknown model": ("POST", "/v1/completions", {"model": "nope", "prompt": "x"}, KEY),
        "too long": ("POST", "/v1/completions",
                     {"model": SERVED, "prompt": "x", "max_tokens": 4 * MAX_MODEL_LEN}, KEY),
    }  # fmt: skip
    answers: dict[str, dict[str, tuple[int, object]]] = {}
    for name, server in pair.both():
        for what, (method, path, body, key) in requests.items():
            status, reply = http(method, server.base_url + path, body, key)
            answers.setdefault(what, {})[name] = (status, error_shape(reply))
    for what, by_server in answers.items():
        assert by_server["real"] == by_server["standin"], (what, by_server)
    assert answers["unknown model"]["real"][0] == 404 and answers["too long"]["real"][0] == 400
    status, reply = http("POST", pair.real.base_url + "/v1/completions",
                         {"model": "nope", "prompt": "x"}, KEY)  # fmt: skip
    message = "The model `nope` does not exist. Valid aliases: tiny."
    assert json.loads(reply)["error"]["message"] == message


def metric_families(text: str) -> dict[str, set[str]]:
    """vllm:* family -> the label names its samples carry (`le`, `quantile` aside)."""
    families: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            names = set(re.findall(r'(\w+)="', match.group(3))) - {"le", "quantile"}
            families.setdefault(match.group(1), set()).update(names)
    return families


def dashboard_metrics() -> set[str]:
    names = set()
    for _, expr in dashboard_queries():
        names |= {re.sub(r"_(bucket|total|count|sum)$", "", n)
                  for n in re.findall(r"vllm:[a-z0-9_]+", expr)}  # fmt: skip
    return names


def test_the_dashboards_metrics_have_vllms_names_and_labels(pair: Pair) -> None:
    seen = {}
    for name, server in pair.both():
        status, body = http("GET", server.base_url + "/metrics")
        assert status == 200
        seen[name] = metric_families(body.decode())
    wanted = dashboard_metrics()
    assert wanted, "the dashboards query no vLLM metric"
    for family in sorted(wanted):
        assert family in seen["real"], f"{family}: not a metric of real vLLM"
        assert family in seen["standin"], f"{family}: not a metric of the stand-in"
        assert seen["standin"][family] == seen["real"][family], (family, seen)


def test_every_dashboard_query_answers_on_real_vllm(pair: Pair, tmp_path: Path) -> None:
    """Debian's Prometheus scraping real vLLM under a steady load: every query of the shipped
    dashboards (as Grafana sends it; the node panels aside: no node_exporter here) returns a
    series, none NaN."""
    prometheus = Prometheus(f"127.0.0.1:{pair.real.port}", tmp_path)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            body = {"model": SERVED, "prompt": "hello there", "max_tokens": 8}
            http("POST", pair.real.base_url + "/v1/completions", body, KEY)
            time.sleep(0.1)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        prometheus.wait_ready()
        time.sleep(20)  # 15 s rate window (test_metrics.RATE_WINDOW) and some
        empty = []
        for title, expr in dashboard_queries():
            if "node_" in expr:
                continue
            sent = expr.replace("$model_name", SERVED).replace("$__rate_interval", "15s")
            result = prometheus.query(sent)
            if not result or any(s["value"][1] in ("NaN", "+Inf", "-Inf") for s in result):
                empty.append(title)
    finally:
        stop.set()
        loader.join(timeout=10)
        prometheus.stop()
    assert empty == [], f"queries without series (or NaN) on real vLLM: {empty}"


def test_bench_serve_writes_the_keys_the_program_reads(
    pair: Pair, real_vllm: RealVllm, standin_bin: Path, tmp_path: Path
) -> None:
    """Each server's own `vllm bench serve` (vllm-bench.sh's flags), its result file summed up
    by components/scripts/bench_summary.py as the program does."""
    summaries = {}
    for (name, server), bin_dir in zip(pair.both(), (real_vllm.bin, standin_bin), strict=True):
        tokenizer = real_vllm.model  # the served snapshot's tokenizer, as vllm-bench.sh finds
        done, result = bench(bin_dir, server.base_url, tmp_path / name, KEY, 2, tokenizer)
        assert done.returncode == 0, (name, done.stdout[-2000:], done.stderr[-2000:])
        summary = subprocess.run(
            ["python3", str(SCRIPTS / "bench_summary.py"), "2", "8"],
            input=json.dumps(result), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert summary.returncode == 0, (name, summary.stderr)
        line = summary.stdout.strip().splitlines()[-1]
        summaries[name] = json.loads(line.removeprefix("benchmark: "))
    assert summaries["real"].keys() == summaries["standin"].keys(), summaries
    assert summaries["real"]["requests"] == 8 and summaries["real"]["outputTokensPerSecond"] > 0


def test_a_headless_rank_without_its_rendezvous_waits_alike(
    real_vllm: RealVllm, standin_bin: Path, hf_home: Path, tmp_path: Path
) -> None:
    """A headless node (`--nnodes 2 --node-rank 1`) whose master port nobody listens on: both
    keep waiting (vLLM's TCPStore client retries until its own timeout; the program's launcher,
    not vLLM, bounds it), and neither listens on the API port meanwhile."""
    closed = free_port()
    args = ("--tensor-parallel-size", "2", "--distributed-executor-backend", "mp",
            "--nnodes", "2", "--node-rank", "1", "--headless", "--master-addr", "127.0.0.1",
            "--master-port", str(closed), "--max-model-len", str(MAX_MODEL_LEN),
            "--dtype", "float32", "--enforce-eager")  # fmt: skip
    ranks = [
        serve(bin_dir, hf_home, tmp_path / f"{name}.log", *args)
        for name, bin_dir in (("real", real_vllm.bin), ("standin", standin_bin))
    ]
    try:
        time.sleep(45)
        for rank in ranks:
            assert rank.process is not None
            assert rank.process.poll() is None, f"exited {rank.process.returncode}:\n{rank.log}"
            with pytest.raises(OSError):
                http("GET", rank.base_url + "/health", timeout=2)
    finally:
        for rank in ranks:
            rank.stop()


# Real vLLM's own choice of weight files (default_loader.py DefaultModelLoader._prepare_weights),
# for a hub id from the local cache offline, as the program serves: the basenames it returns.
PREPARE_WEIGHTS = """
import json, os, sys
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
chosen = {}
for model, load_format in json.loads(sys.argv[1]):
    loader = DefaultModelLoader(LoadConfig(load_format=load_format))
    try:
        _, files, _, _ = loader._prepare_weights(
            model_name_or_path=model, subfolder=None, revision=None, fall_back_to_pt=True,
            allow_patterns_overrides=None)
    except RuntimeError as error:  # "Cannot find any model weights"
        files = [] if "Cannot find any model weights" in str(error) else [repr(error)]
    chosen[model] = sorted(os.path.basename(f) for f in files)
print("chosen: " + json.dumps(chosen))
"""


def test_the_weights_we_size_and_compare_are_the_ones_real_vllm_loads(
    real_vllm: RealVllm, tmp_path: Path
) -> None:
    """Every snapshot shape of tests/weight_files.py (the table the memory check's sizing,
    tests/program/test_vllm_weights.py, and the stand-in's rank check, test_weights_check.py,
    are held to): real vLLM picks the files the table says."""
    home = tmp_path / "hf"
    models = []
    for number, shape in enumerate(SHAPES):
        model = f"spark-lab/shape-{number}"
        write_snapshot(home, shape, model)
        models.append((model, shape.load_format))
    done = subprocess.run(
        [str(real_vllm.bin / "python"), "-c", PREPARE_WEIGHTS, json.dumps(models)],
        capture_output=True, text=True, timeout=240, env=environment(real_vllm.bin, home),
    )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("chosen: ")), None)
    assert done.returncode == 0 and line is not None, done.stderr[-3000:]
    chosen = json.loads(line.removeprefix("chosen: "))
    expected = {
        model: sorted(shape.loaded) for (model, _), shape in zip(models, SHAPES, strict=True)
    }
    assert chosen == expected
