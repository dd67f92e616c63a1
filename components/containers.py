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

    Restarts are bounded (on-failure, docker.maxRestarts): a crash loop ends as a stopped
    container that the wait steps and `pulumi refresh` report, instead of eating unified memory.
    """
    cfg = plan.config
    env = node_env(plan, node)
    args: dict[str, Any] = {
        "image": image_id,
        "envs": [f"{key}={value}" for key, value in sorted(env.items())],
        "network_mode": "host",
        "ipc_mode": "host",
        "init": True,
        "restart": "on-failure",
        "max_retry_count": cfg.docker.max_restarts,
        "must_run": True,
        "mounts": [
            _bind(cfg.model.cache_dir, CONTAINER_HF_HOME),
            _bind(node.ray_dir, CONTAINER_RAY_DIR),
            _bind(node.bin_dir, SCRIPTS_MOUNT, read_only=True),
        ],
        "labels": [
            docker.ContainerLabelArgs(label=key, value=value)
            for key, value in sorted(
                {
                    **plan.labels,
                    "spark-vllm.role": role,
                    "spark-vllm.node": node.name,
                    "spark-vllm.mounts": mounts_token,
                }.items()
            )
        ],
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
