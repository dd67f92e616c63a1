"""Container settings shared by every Ray/vLLM container: one place, so nodes cannot drift apart."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_docker as docker

from stacks.nodes import (
    CONTAINER_HF_HOME,
    CONTAINER_RAY_DIR,
    DeploymentPlan,
    NodePlan,
    node_env,
)

SCRIPTS_MOUNT = "/spark-vllm/bin"

# Ray: `on-failure` restarts a crash, and, after a reboot, the exit the shutdown caused (a
# non-zero one: daemon/daemon.go restore restarts what ShouldRestart() accepts), but not the
# clean exit of a `ray stop`, which is how a host leaving the stack leaves Ray.
# The server and the PID-namespace holder: `unless-stopped`, because vLLM's clean exit on the
# shutdown's SIGTERM is a 0, which `on-failure` would leave down after a reboot.
RESTART_POLICY = {
    "ray-head": "on-failure",
    "ray-worker": "on-failure",
    "vllm": "unless-stopped",
    "head-namespace": "unless-stopped",
}


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
        "must_run": True,
        "mounts": [
            _bind(cfg.model.cache_dir, CONTAINER_HF_HOME),
            _bind(node.ray_dir, CONTAINER_RAY_DIR),
            _bind(node.bin_dir, SCRIPTS_MOUNT, read_only=True),
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


def head_namespace_args(plan: DeploymentPlan, image_id: pulumi.Input[str]) -> dict[str, Any]:
    """The head's namespace holder: a container that only sleeps, whose PID and network
    namespaces the Ray head and the server join (the server's Ray driver finds the raylet among
    the processes it can see).

    Nothing in it crashes, so a Ray head that restarts does not take the server's namespace
    down with it, and the server, restarting, always finds one to join (moby's restart gives up
    for good when a start fails). Joining through the network mode too is what makes Docker
    start the holder first after a reboot (daemon/daemon.go restore waits for a
    `container:` network's container, not for a `container:` PID mode's).
    """
    return {
        "image": image_id,
        "entrypoints": ["sleep", "infinity"],
        "network_mode": "host",
        "init": True,  # the namespace's PID 1: it reaps what the Ray and vLLM processes orphan
        "restart": RESTART_POLICY["head-namespace"],
        "must_run": True,
        "labels": _labels(plan, plan.head, "head-namespace", {}),
        "destroy_grace_seconds": 10,
        "stop_timeout": 10,
    }


def in_head_namespace(settings: dict[str, Any], holder: pulumi.Resource) -> dict[str, Any]:
    """`settings` of a head container, moved into the holder's PID and network namespaces (the
    holder is on the host network, so it still is).

    By the holder's ID, not its name: Docker stores `container:<ID>` whatever it was given
    (moby daemon/daemon_unix.go adaptSharedNamespaceContainer) and pulumi-docker's Read stores
    what Docker reports (terraform-provider-docker resource_docker_container_funcs.go), so a
    name would be a replacement at every `pulumi up --refresh`. A new holder is a new ID: the
    containers that joined the old one are replaced with it.
    """
    assert isinstance(holder, docker.Container)
    joined = holder.id.apply(lambda holder_id: f"container:{holder_id}")
    return {**settings, "network_mode": joined, "pid_mode": joined}


def _labels(
    plan: DeploymentPlan, node: NodePlan, role: str, extra: dict[str, str]
) -> list[docker.ContainerLabelArgs]:
    labels = {**plan.labels, "spark-vllm.role": role, "spark-vllm.node": node.name, **extra}
    return [docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())]
