"""The Ray cluster: a container per node with Ray as its main process, then a bounded join wait."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.bundle import entry_scripts
from components.containers import service_container
from components.host import Host
from components.steps import host_step
from stacks.plan import server
from stacks.plan.containers import RAY_HEAD_ID_LABEL, ray_container
from stacks.plan.later import PINNED_IMAGE
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class RayClusterArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]
    image: pulumi.Output[str]  # its pinned name (stacks/plan/image.py pinned_image)
    image_ready: dict[str, pulumi.Resource]
    memory_checked: pulumi.Resource  # measured before anything of ours starts (ServerMemory)
    firewalled: dict[str, pulumi.Resource]  # by node name: its rules hold (none: firewall off)


class RayCluster(pulumi.ComponentResource):
    head_container: docker.Container
    worker_containers: list[docker.Container]
    joined: remote.Command

    def __init__(self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:RayCluster", name, None, opts)
        plan = args.plan
        self.head_container = self._container(f"{name}-head", args, args.head)
        self.worker_containers = [
            self._container(
                f"{name}-{w.node.name}",
                args,
                w,
                after=[self.head_container],
                # Workers joined this head: a replaced head must replace them too.
                id_labels=[(RAY_HEAD_ID_LABEL, self.head_container.id)],
            )
            for w in args.workers
        ]
        containers = [self.head_container, *self.worker_containers]
        self.joined = host_step(
            server.ray_wait(plan, name),
            [args.head],
            parent=self,
            after=containers,
            values={PINNED_IMAGE: args.image},
            # A replaced container means a new cluster: wait for it again.
            triggers=[c.id for c in containers],
        )
        self.register_outputs({"headContainerId": self.head_container.id})

    def _container(
        self,
        resource_name: str,
        args: RayClusterArgs,
        host: Host,
        after: list[docker.Container] | None = None,
        id_labels: list[tuple[str, pulumi.Input[str]]] | None = None,
    ) -> docker.Container:
        return service_container(
            resource_name,
            ray_container(args.plan, host.node, host.mounts_token, entry_scripts()),
            args.image,
            provider=host.provider,
            parent=self,
            after=[
                *host.prepared,
                *([args.firewalled[host.node.name]] if host.node.name in args.firewalled else []),
                args.image_ready[host.node.name],
                args.memory_checked,
                *(after or []),
            ],
            id_labels=id_labels or [],
        )
