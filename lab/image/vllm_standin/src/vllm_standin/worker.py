"""The per-rank worker: what one vLLM GPU worker would see on its node.

It runs as a Ray actor pinned to one placement-group bundle (Ray backend) or in the API server's
own process (uni/mp backend). Its environment is its node's (the raylet's), not the driver's:
vLLM copies only VLLM_* and HF token variables to workers, so NCCL/GLOO settings must be set on
every node, which is exactly what the lab should catch.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from vllm_standin.model_files import SnapshotReport, measure_snapshot

REPORTED_ENV = (
    "VLLM_HOST_IP",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "CUDA_VISIBLE_DEVICES",
    "HF_HOME",
    "HF_HUB_OFFLINE",
)


@dataclass(frozen=True)
class RankReport:
    rank: int
    node_ip: str
    host_ip: str  # vLLM's get_ip(): VLLM_HOST_IP, else the node IP
    node_id: str
    hostname: str
    pid: int
    snapshot: SnapshotReport
    env: dict[str, str | None]
    gloo_problem: str | None
    # The API key reached this worker (vLLM's Ray executor copies the driver's VLLM_*): it must
    # not (spark-vllm lists it in vLLM's non-carry-over file). Only whether, never the value.
    holds_api_key: bool = False
    # torch.compile, as each vLLM rank runs it: loaded from the compile cache, or compiled.
    compile_seconds: float = 0.0
    compile_cached: bool = False
    compile_dir: str = ""


# What a cold compile costs the stand-in (a real one takes minutes for a large model).
COMPILE_SECONDS_ENV = "VLLM_STANDIN_COMPILE_SECONDS"
DEFAULT_COMPILE_SECONDS = 3.0
COMPILED_FILE = "computation_graph.py"  # one of the files vLLM writes per rank


def compile_dir(key: str, rank: int) -> str:
    """vLLM's per-rank compile cache: <VLLM_CACHE_ROOT>/torch_compile_cache/<hash>/rank_<r>_<dp>
    (vllm/compilation/backends.py; VLLM_CACHE_ROOT defaults to ~/.cache/vllm, vllm/envs.py)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
    return os.path.join(root, "torch_compile_cache", key, f"rank_{rank}_0")


def compile_graph(key: str, rank: int) -> tuple[float, bool, str]:
    """Load this rank's compiled graph from the cache, or "compile" it (sleep) and store it:
    (seconds, whether it came from the cache, the directory)."""
    where = compile_dir(key, rank)
    started = time.monotonic()
    if os.path.isfile(os.path.join(where, COMPILED_FILE)):
        return time.monotonic() - started, True, where
    raw = os.environ.get(COMPILE_SECONDS_ENV, "").strip()
    time.sleep(float(raw) if raw else DEFAULT_COMPILE_SECONDS)
    os.makedirs(where, exist_ok=True)
    partial = os.path.join(where, f".{COMPILED_FILE}.{os.getpid()}")
    with open(partial, "w") as out:
        out.write(f"# vllm-standin compiled graph, key {key}, rank {rank}\n")
    os.replace(partial, os.path.join(where, COMPILED_FILE))
    return time.monotonic() - started, False, where


def interface_exists(name: str) -> bool:
    return os.path.exists(os.path.join("/sys/class/net", name))


def gloo_interface_problem(value: str | None, hostname: str) -> str | None:
    """What Gloo would fail with for this GLOO_SOCKET_IFNAME on this node, or None."""
    if not value:
        return (
            "Gloo connectFullMesh failed: GLOO_SOCKET_IFNAME is not set in the worker's "
            f"environment on {hostname}, so Gloo binds the address its hostname resolves to "
            "(often loopback). Set GLOO_SOCKET_IFNAME on every node's Ray container."
        )
    for interface in value.split(","):
        if not interface_exists(interface.strip()):
            return (
                "[enforce fail at gloo/transport/tcp/device.cc] ifa != nullptr. "
                f"Unable to find address for: {interface.strip()} "
                f"(GLOO_SOCKET_IFNAME={value!r}; no such interface on {hostname})"
            )
    return None


def detect_node_ip() -> str:
    import ray.util

    return str(ray.util.get_node_ip_address())


def vllm_get_ip() -> str:
    """vLLM's get_ip() (vllm/utils/network_utils.py): VLLM_HOST_IP, else the address of the
    route towards a public IP (a UDP connect sends nothing)."""
    if os.environ.get("VLLM_HOST_IP"):
        return os.environ["VLLM_HOST_IP"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("8.8.8.8", 80))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def current_node_id() -> str:
    import ray

    if not ray.is_initialized():
        return "local"
    return str(ray.get_runtime_context().get_node_id())


class RankWorker:
    """Holds one rank alive for the lifetime of the server, as a vLLM worker would."""

    def __init__(self, rank: int, model: str, revision: str | None, compile_key: str) -> None:
        self.rank = rank
        self.model = model
        self.revision = revision
        self.compile_key = compile_key

    def describe(self, node_ip: str | None = None) -> RankReport:
        """`node_ip`: given without Ray (the mp executor), else Ray's view of this node."""
        hostname = socket.gethostname()
        node_ip = node_ip or detect_node_ip()
        env = {name: os.environ.get(name) for name in REPORTED_ENV}
        seconds, cached, where = compile_graph(self.compile_key, self.rank)
        return RankReport(
            rank=self.rank,
            node_ip=node_ip,
            host_ip=os.environ.get("VLLM_HOST_IP") or node_ip,
            node_id=current_node_id(),
            hostname=hostname,
            pid=os.getpid(),
            snapshot=measure_snapshot(self.model, self.revision),
            env=env,
            gloo_problem=gloo_interface_problem(env["GLOO_SOCKET_IFNAME"], hostname),
            holds_api_key=bool(os.environ.get("VLLM_API_KEY")),
            compile_seconds=seconds,
            compile_cached=cached,
            compile_dir=where,
        )

    def ping(self) -> int:
        return self.rank
