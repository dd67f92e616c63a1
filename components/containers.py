"""Container settings shared by every Ray/vLLM container: one place, so nodes cannot drift apart."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_docker as docker

from stacks.nodes import (
    CONTAINER_HF_HOME,
    CONTAINER_RAY_DIR,
    CONTAINER_SCRIPTS_DIR,
    DeploymentPlan,
    NodePlan,
    node_env,
)

# Ray: `on-failure` restarts a crash, and, after a reboot, the exit the shutdown caused (a
# non-zero one: daemon/daemon.go restore restarts what ShouldRestart() accepts), but not the
# clean exit of a `ray stop`, which is how a host leaving the stack leaves Ray.
# The server: `unless-stopped`, because vLLM's clean exit on the shutdown's SIGTERM is a 0,
# which `on-failure` would leave down after a reboot.
RESTART_POLICY = {"ray-head": "on-failure", "ray-worker": "on-failure", "vllm": "unless-stopped"}

# The server's Ray driver finds its node's raylet among the processes it can see (Ray 2.x), so
# the server and the Ray head must share a PID namespace. The host's, not the Ray head
# container's (`container:<head>`): joining a container's namespace fails while that container
# is not running, and Docker then gives up on the joiner for good, both when a restart's start
# fails (daemon/monitor.go) and at boot, where Docker before 29 starts containers in no order
# (daemon/daemon.go restore waits for dependencies only since moby d4e026fe20, API 1.52).
HOST_PID_ROLES = frozenset({"ray-head", "vllm"})


def service_container_args(
    plan: DeploymentPlan,
    node: NodePlan,
    role: str,
    image_id: pulumi.Input[str],
    mounts_token: str,
) -> dict[str, Any]:
    """Host network and IPC, --init, GPUs, RDMA (memlock, devices) when the node has HCAs, the
    HF cache and Ray's session dir.

    `mounts_token` changes when a bound host directory was recreated (components/facts.py): the
    label makes that a replacement, so no container stays bound to a directory that is gone.

    Restart policies (moby daemon/internal/restartmanager): every restart waits 100 ms,
    doubling up to 1 min while a container keeps exiting within 10 s, so a crash loop backs
    off; there is no retry bound, because Docker counts retries per container lifetime. See
    RESTART_POLICY for which policy and why.
    """
    cfg = plan.config
    env = node_env(plan, node)
    args: dict[str, Any] = {
        "image": image_id,
        "envs": [f"{key}={value}" for key, value in sorted(env.items())],
        "network_mode": "host",
        "ipc_mode": "host",
        "init": True,
        "restart": RESTART_POLICY[role],
        **({"pid_mode": "host"} if role in HOST_PID_ROLES else {}),
        "must_run": True,
        "mounts": [
            _bind(cfg.model.cache_dir, CONTAINER_HF_HOME),
            _bind(node.ray_dir, CONTAINER_RAY_DIR),
            _bind(node.bin_dir, CONTAINER_SCRIPTS_DIR, read_only=True),
        ],
        "labels": _labels(plan, node, role, {"spark-vllm.mounts": mounts_token}),
        "destroy_grace_seconds": 30,
        "stop_timeout": 30,
    }
    if cfg.docker.request_gpus:
        args["gpus"] = "all"
    if cfg.docker.shm_size_mb is not None:
        args["shm_size"] = cfg.docker.shm_size_mb
    if node.rdma_hcas:
        # RoCE needs pinned memory and the verbs devices; without HCAs NCCL uses sockets.
        args["ulimits"] = [docker.ContainerUlimitArgs(name="memlock", soft=-1, hard=-1)]
        args["devices"] = [
            docker.ContainerDeviceArgs(
                host_path="/dev/infiniband", container_path="/dev/infiniband"
            )
        ]
    return args


def _bind(source: str, target: str, read_only: bool = False) -> docker.ContainerMountArgs:
    return docker.ContainerMountArgs(type="bind", source=source, target=target, read_only=read_only)


def _labels(
    plan: DeploymentPlan, node: NodePlan, role: str, extra: dict[str, str]
) -> list[docker.ContainerLabelArgs]:
    labels = {**plan.labels, "spark-vllm.role": role, "spark-vllm.node": node.name, **extra}
    return [docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())]
