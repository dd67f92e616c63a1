"""The vLLM server on the head (joined to the Ray cluster, or with executor mp, to a headless
vLLM on every worker) and its readiness check."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.bundle import entry_scripts
from components.containers import service_container
from components.host import Host
from components.ray_cluster import RayCluster
from components.steps import host_step
from stacks.plan import server
from stacks.plan.containers import (
    API_KEY_HASH_LABEL,
    MP_NODES_LABEL,
    RAY_CLUSTER_LABEL,
    ContainerSpec,
    headless_container,
    vllm_container,
)
from stacks.plan.later import PINNED_IMAGE, Later
from stacks.plan.nodes import DeploymentPlan, ServerSizing


@dataclass(frozen=True)
class VllmServerArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]
    image: pulumi.Output[str]  # its pinned name (stacks/plan/image.py pinned_image)
    image_ready: dict[str, pulumi.Resource]  # by node name
    memory_checked: pulumi.Resource  # measured before anything of ours starts (ServerMemory)
    ray: RayCluster | None  # executor ray: the cluster the server joins; mp: none
    weights_ready: list[pulumi.Resource]
    api_key: pulumi.Output[str]  # a secret, never empty
    sizing: ServerSizing  # configured, or with `auto` the memory check's later values:
    chosen: dict[Later, pulumi.Output[str]]  # what it chose (components/memory.py)
    key_file: pulumi.Resource  # the key's file on the head (components/front.py)
    front: docker.Container  # the front's container: the readiness probe goes through it
    firewalled: dict[str, pulumi.Resource]  # by node name: its rules hold (none: firewall off)


class VllmServer(pulumi.ComponentResource):
    container: docker.Container
    headless_containers: list[docker.Container]  # executor mp: one per worker, started first
    readiness: remote.Command  # the served model answered a real completion
    fabric_transport: pulumi.Output[str]  # which network NCCL chose (README, Outputs)

    def __init__(self, name: str, args: VllmServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:VllmServer", name, None, opts)
        plan, head = args.plan, args.head
        key_file = args.key_file
        # mp: each worker's ranks first; they wait (bounded) for the head's rendezvous. The
        # server then joins them, and carries their IDs: a replaced worker replaces the server
        # too (deleted first, as a delete-before-replace base takes its dependents down), so a
        # new worker always meets a new server, never one that already formed its group. A
        # replaced server alone does not replace them: they rejoin the next one by themselves
        # (their launcher restarts them when the rendezvous they joined is gone).
        self.headless_containers = [
            self._container(
                f"{name}-{worker.node.name}",
                args,
                worker,
                functools.partial(
                    headless_container, plan, worker.node, worker.mounts_token, entry_scripts()
                ),
                after=list(args.weights_ready),
            )
            for worker in (args.workers if args.ray is None else [])
        ]
        joined: list[pulumi.Resource] = (
            [args.ray.joined] if args.ray is not None else list(self.headless_containers)
        )
        cluster_label: list[tuple[str, pulumi.Input[str]]] = (
            [(RAY_CLUSTER_LABEL, args.ray.joined.id)]
            if args.ray is not None
            else [
                (
                    MP_NODES_LABEL,
                    pulumi.Output.all(*[c.id for c in self.headless_containers]).apply(
                        lambda ids: ",".join(str(i) for i in ids) or "none"
                    ),
                )
            ]
        )
        self.container = self._container(
            f"{name}-container",
            args,
            head,
            functools.partial(vllm_container, plan, head.mounts_token, entry_scripts()),
            after=[*joined, key_file, *args.weights_ready],
            id_labels=[
                # The cluster it joined: any Ray container replaced (a new head, or a worker
                # recreated after a refresh found it gone) replaces the wait, and the server;
                # with mp, the headless containers it meets.
                *cluster_label,
                # A new key must restart vLLM; only its hash (still a secret) is in the config.
                (API_KEY_HASH_LABEL, args.api_key.apply(_sha256)),
            ],
        )
        containers = [self.container, *self.headless_containers, args.front]
        self.readiness = host_step(
            server.vllm_ready(plan, name),
            [head],
            parent=self,
            after=containers,
            stdin={"api-key": args.api_key},
            values={PINNED_IMAGE: args.image},
            triggers=[c.id for c in containers],
        )
        self.fabric_transport = self.readiness.stdout.apply(
            functools.partial(_checked_transport, expected_rdma=plan.expects_rdma)
        )
        self.register_outputs({"containerId": self.container.id, "ready": self.readiness.stdout})

    def _container(
        self,
        resource_name: str,
        args: VllmServerArgs,
        host: Host,
        spec: Callable[[ServerSizing], ContainerSpec],
        after: list[pulumi.Resource],
        id_labels: list[tuple[str, pulumi.Input[str]]] | None = None,
    ) -> docker.Container:
        """`spec` takes the server's memory sizing: with `auto` known once the memory check ran."""
        return service_container(
            resource_name,
            spec(args.sizing),
            args.image,
            values=args.chosen,
            provider=host.provider,
            parent=self,
            # With Ray, these come before the cluster the server joins.
            after=after
            if args.ray is not None
            else [
                *host.prepared,
                *([args.firewalled[host.node.name]] if host.node.name in args.firewalled else []),
                args.image_ready[host.node.name],
                args.memory_checked,
                *after,
            ],
            id_labels=id_labels or [],
        )


def _checked_transport(readiness: str, expected_rdma: bool) -> str:
    """The transport NCCL chose; a loud warning in the `pulumi up` output when hosts have HCAs
    but NCCL did not use them."""
    found = server.parse_fabric_transport(readiness)
    if expected_rdma and not found.startswith("ib"):
        pulumi.log.warn(
            f"NCCL is not using RDMA between the nodes (fabricTransport: {found}): "
            "tensor-parallel decode is then several times slower; check hosts[].rdmaHcas "
            "(ibv_devinfo), the RoCE link, and the image's NCCL (README, Failures)"
        )
    return found


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16] if value else "none"
