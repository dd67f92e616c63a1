"""A container spec (stacks/plan/containers.py) as a pulumi-docker Container on its host."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_docker as docker

from stacks.plan.containers import ContainerSpec


def service_container(
    resource_name: str,
    spec: ContainerSpec,
    image_id: pulumi.Input[str],
    *,
    provider: docker.Provider,
    parent: pulumi.Resource,
    after: Sequence[pulumi.Resource],
    id_labels: Sequence[tuple[str, pulumi.Input[str]]] = (),
    command: pulumi.Input[Sequence[str]] | None = None,
) -> docker.Container:
    """`id_labels` name other resources' IDs: when one is replaced, so is this container.
    `command`, when given, stands for the spec's: one known only once another resource exists.

    Fixed container names: the old container must go before its replacement starts
    (delete_before_replace; pulumi-docker would otherwise create first and collide).
    """
    labels = [*spec.labels, *id_labels]
    return docker.Container(
        resource_name,
        name=spec.name,
        entrypoints=list(spec.entrypoint),
        command=command if command is not None else list(spec.command),
        **_container_args(spec, image_id),
        labels=[docker.ContainerLabelArgs(label=key, value=value) for key, value in labels],
        opts=pulumi.ResourceOptions(
            parent=parent,
            provider=provider,
            depends_on=list(after),
            delete_before_replace=True,
            custom_timeouts=pulumi.CustomTimeouts(create="10m", delete="5m"),
        ),
    )


def _container_args(spec: ContainerSpec, image_id: pulumi.Input[str]) -> dict[str, Any]:
    args: dict[str, Any] = {
        "image": image_id,
        "envs": list(spec.env),
        "network_mode": "host",
        "ipc_mode": "host",
        "init": True,
        "restart": spec.restart,
        **({"pid_mode": "host"} if spec.host_pid else {}),
        "must_run": True,
        "mounts": [
            docker.ContainerMountArgs(
                type="bind", source=m.source, target=m.target, read_only=m.read_only
            )
            for m in spec.mounts
        ],
        "destroy_grace_seconds": spec.stop_seconds,
        "stop_timeout": spec.stop_seconds,
    }
    if spec.user is not None:
        args["user"] = spec.user
    if spec.capabilities:
        args["capabilities"] = docker.ContainerCapabilitiesArgs(adds=list(spec.capabilities))
    if spec.gpus:
        args["gpus"] = "all"
    if spec.shm_size_mb is not None:
        args["shm_size"] = spec.shm_size_mb
    if spec.ulimits:
        args["ulimits"] = [
            docker.ContainerUlimitArgs(name=u.name, soft=u.soft, hard=u.hard) for u in spec.ulimits
        ]
    if spec.devices:
        args["devices"] = [
            docker.ContainerDeviceArgs(host_path=path, container_path=path) for path in spec.devices
        ]
    return args
