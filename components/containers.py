"""A container spec (stacks/plan/containers.py) as a pulumi-docker Container on its host."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi_docker as docker

from stacks.plan.containers import ContainerSpec
from stacks.plan.later import Later, consumed, resolve_argv


def service_container(
    resource_name: str,
    spec: ContainerSpec,
    image_id: pulumi.Input[str],
    *,
    provider: docker.Provider,
    parent: pulumi.Resource,
    after: Sequence[pulumi.Resource],
    id_labels: Sequence[tuple[str, pulumi.Input[str]]] = (),
    values: Mapping[Later, pulumi.Input[str]] | None = None,
) -> docker.Container:
    """`id_labels` name other resources' IDs: when one is replaced, so is this container.
    `values`: the later values its command consumes (stacks/plan/later.py).

    Fixed container names: the old container must go before its replacement starts
    (delete_before_replace; pulumi-docker would otherwise create first and collide).
    """
    labels = [*spec.labels, *id_labels]
    return docker.Container(
        resource_name,
        name=spec.name,
        entrypoints=list(spec.entrypoint),
        command=_command(spec, values or {}),
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


def _command(
    spec: ContainerSpec, values: Mapping[Later, pulumi.Input[str]]
) -> pulumi.Input[Sequence[str]]:
    """The spec's command; one that consumes later values once they are known."""
    given = {later.name: value for later, value in values.items()}
    needs = consumed(*spec.command)
    if not needs:
        return list(spec.command)
    missing = [name for name in needs if name not in given]
    if missing:
        raise AssertionError(f"{spec.name}: its command consumes {missing}, which are not given")
    command = spec.command
    return pulumi.Output.all(**{name: given[name] for name in needs}).apply(
        lambda known: resolve_argv(command, known)
    )


def _container_args(spec: ContainerSpec, image_id: pulumi.Input[str]) -> dict[str, Any]:
    args: dict[str, Any] = {
        "image": image_id,
        "envs": list(spec.env),
        "network_mode": spec.network,
        # No network: IPC Docker's default too (an unset ipc_mode is no diff: Optional+Computed).
        **({"ipc_mode": "host"} if spec.network == "host" else {}),
        "init": spec.init,
        "restart": spec.restart,
        **({"pid_mode": "host"} if spec.host_pid else {}),
        "must_run": True,
        "mounts": [
            docker.ContainerMountArgs(
                type=m.kind, source=m.source, target=m.target, read_only=m.read_only
            )
            for m in spec.mounts
        ],
        "destroy_grace_seconds": spec.stop_seconds,
        "stop_timeout": spec.stop_seconds,
    }
    if spec.memory_mb is not None:
        # memory_swap equal to memory: no swap. The provider reads both back in MB
        # (resourceDockerContainerRead), so neither is a diff at the next refresh.
        args["memory"] = spec.memory_mb
        args["memory_swap"] = spec.memory_mb
    if spec.user is not None:
        args["user"] = spec.user
    if spec.capabilities or spec.dropped:
        args["capabilities"] = docker.ContainerCapabilitiesArgs(
            **({"adds": list(spec.capabilities)} if spec.capabilities else {}),
            **({"drops": list(spec.dropped)} if spec.dropped else {}),
        )
    # Each only when set: `security_opts` is Optional+Computed (unset: Docker's value kept, no
    # diff); `read_only` is read back always (false when unset, the zero value: no diff).
    if spec.security_opts:
        args["security_opts"] = list(spec.security_opts)
    if spec.read_only_rootfs:
        args["read_only"] = True
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
