"""Every Ray/vLLM container as a pure spec: image role, command, env, mounts, limits, restart.

One place for what every service container shares, so nodes cannot drift apart. The components
turn a spec into a pulumi-docker Container (components/containers.py) and add the labels that
name other resources' IDs (a Ray head's, the cluster's), which exist only once those do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from stacks.plan.nodes import (
    CONTAINER_API_KEY_DIR,
    CONTAINER_HF_HOME,
    CONTAINER_RAY_DIR,
    CONTAINER_SCRIPTS_DIR,
    DeploymentPlan,
    NodePlan,
    node_env,
    ray_start_args,
    vllm_launcher_args,
)

Role = Literal["ray-head", "ray-worker", "vllm", "vllm-headless"]

# Ray: `on-failure` restarts a crash, and, after a reboot, the exit the shutdown caused (a
# non-zero one: daemon/daemon.go restore restarts what ShouldRestart() accepts), but not the
# clean exit of a `ray stop`, which is how a host leaving the stack leaves Ray.
# The server, and with executor mp each headless node's: `unless-stopped`, because vLLM's
# clean exit on the shutdown's SIGTERM is a 0, which `on-failure` would leave down after a
# reboot.
RESTART_POLICY: dict[Role, str] = {
    "ray-head": "on-failure",
    "ray-worker": "on-failure",
    "vllm": "unless-stopped",
    "vllm-headless": "unless-stopped",
}

# The server's Ray driver finds its node's raylet among the processes it can see (Ray 2.x), so
# the server and the Ray head must share a PID namespace. The host's, not the Ray head
# container's (`container:<head>`): joining a container's namespace fails while that container
# is not running, and Docker then gives up on the joiner for good, both when a restart's start
# fails (daemon/monitor.go) and at boot, where Docker before 29 starts containers in no order
# (daemon/daemon.go restore waits for dependencies only since moby d4e026fe20, API 1.52).
# Without Ray (executor mp) no driver looks for a raylet: the server keeps its own namespace.
HOST_PID_ROLES: frozenset[Role] = frozenset({"ray-head", "vllm"})

# Labels whose values are other resources' IDs (set by the components).
RAY_HEAD_ID_LABEL = "spark-vllm.ray-head-id"  # a worker joined this head: a new head replaces it
RAY_CLUSTER_LABEL = "spark-vllm.ray-cluster"  # the server joined this cluster (ray-joined's ID)
MP_NODES_LABEL = "spark-vllm.mp-nodes"  # mp: the headless containers the server meets
API_KEY_HASH_LABEL = "spark-vllm.api-key-sha256"  # a new key restarts vLLM; only its hash shows
MOUNTS_LABEL = "spark-vllm.mounts"


# The verbs devices RoCE needs (with HCAs only; without them NCCL uses sockets).
RDMA_DEVICES = ("/dev/infiniband",)
# The main thread's stack: 64 MiB, as both two-Spark references run their containers (NVIDIA
# dgx-spark-playbooks nvidia/vllm, eugr/spark-vllm-docker run-cluster-node.sh), the setting
# NVIDIA gives for its PyTorch containers; Docker's default is the daemon's (8 MiB).
STACK_BYTES = 67108864


@dataclass(frozen=True)
class Ulimit:
    name: str
    soft: int  # -1: unlimited
    hard: int


def _ulimits(node: NodePlan) -> tuple[Ulimit, ...]:
    """RoCE registers (pins) the buffers it sends from: memlock unlimited with HCAs."""
    stack = Ulimit("stack", STACK_BYTES, STACK_BYTES)
    return (Ulimit("memlock", -1, -1), stack) if node.rdma_hcas else (stack,)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """One service container; host network and IPC and `--init` are common to all."""

    name: str  # the container's name on its host (fixed: replacing it deletes the old first)
    node: NodePlan
    role: Role
    entrypoint: tuple[str, ...]
    command: tuple[str, ...]
    env: tuple[str, ...]  # KEY=value, sorted
    restart: str
    host_pid: bool
    mounts: tuple[Mount, ...]
    labels: tuple[tuple[str, str], ...]  # sorted
    gpus: bool  # `--gpus all`
    shm_size_mb: int | None
    ulimits: tuple[Ulimit, ...]
    devices: tuple[str, ...]  # host device paths, at the same path inside
    stop_seconds: int = 30


def ray_container(plan: DeploymentPlan, node: NodePlan, mounts_token: str) -> ContainerSpec:
    """Ray as the container's main process (`ray start --block`), head or worker."""
    role: Role = "ray-head" if node.is_head else "ray-worker"
    return _service(plan, node, role, ("ray",), tuple(ray_start_args(plan, node)), mounts_token)


def vllm_container(
    plan: DeploymentPlan, mounts_token: str, launcher: str, gpu_memory_utilization: str
) -> ContainerSpec:
    """The server on the head: `launcher` (vllm-launcher.sh's text) waits for Ray's GPUs and
    reads the API key from a mounted directory, then runs `vllm serve` sized to
    `gpu_memory_utilization` (the configured fraction, or what the memory check derived)."""
    spec = _service(
        plan,
        plan.head,
        "vllm",
        ("bash", "-c", launcher, "vllm-launcher"),
        tuple(vllm_launcher_args(plan, gpu_memory_utilization)),
        mounts_token,
    )
    api_key = Mount(plan.api_key_dir, CONTAINER_API_KEY_DIR, read_only=True)
    return replace(spec, mounts=(*spec.mounts, api_key))


def headless_container(
    plan: DeploymentPlan,
    node: NodePlan,
    mounts_token: str,
    launcher: str,
    gpu_memory_utilization: str,
) -> ContainerSpec:
    """Executor mp: a worker's own vLLM, `--headless` with its node rank; it serves no API and
    never sees the API key."""
    return _service(
        plan,
        node,
        "vllm-headless",
        ("bash", "-c", launcher, "vllm-launcher"),
        tuple(vllm_launcher_args(plan, gpu_memory_utilization, node)),
        mounts_token,
    )


def _service(
    plan: DeploymentPlan,
    node: NodePlan,
    role: Role,
    entrypoint: tuple[str, ...],
    command: tuple[str, ...],
    mounts_token: str,
) -> ContainerSpec:
    """GPUs, RDMA when the node has HCAs, the HF cache, Ray's session dir and the probes.

    `mounts_token` changes when a bound host directory was recreated (components/facts.py): the
    label makes that a replacement, so no container stays bound to a directory that is gone.

    Restart policies (moby daemon/internal/restartmanager): every restart waits 100 ms,
    doubling up to 1 min while a container keeps exiting within 10 s, so a crash loop backs
    off; there is no retry bound, because Docker counts retries per container lifetime. See
    RESTART_POLICY for which policy and why.
    """
    cfg = plan.config
    labels = {
        **plan.labels,
        "spark-vllm.role": role,
        "spark-vllm.node": node.name,
        MOUNTS_LABEL: mounts_token,
    }
    return ContainerSpec(
        name=plan.container_name(role),
        node=node,
        role=role,
        entrypoint=entrypoint,
        command=command,
        env=tuple(f"{key}={value}" for key, value in sorted(node_env(plan, node).items())),
        restart=RESTART_POLICY[role],
        host_pid=role in HOST_PID_ROLES and plan.uses_ray,
        mounts=(
            Mount(cfg.model.cache_dir, CONTAINER_HF_HOME),
            Mount(node.ray_dir, CONTAINER_RAY_DIR),
            Mount(node.bin_dir, CONTAINER_SCRIPTS_DIR, read_only=True),
        ),
        labels=tuple(sorted(labels.items())),
        gpus=cfg.docker.request_gpus,
        shm_size_mb=cfg.docker.shm_size_mb,
        ulimits=_ulimits(node),
        devices=RDMA_DEVICES if node.rdma_hcas else (),
    )
