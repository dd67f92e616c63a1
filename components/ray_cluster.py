"""The Ray cluster: a container per node with Ray as its main process, then a bounded join wait."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.containers import service_container_args
from components.fabric_trust import FabricAccess
from components.host import Host
from components.remote import script_call
from stacks.nodes import (
    CONTAINER_SCRIPTS_DIR,
    DeploymentPlan,
    NodePlan,
    log_specs,
    node_check_specs,
    ray_start_args,
)


@dataclass(frozen=True)
class RayClusterArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]
    image_id: pulumi.Output[str]
    image_ready: dict[str, pulumi.Resource]
    fabric: FabricAccess


def _head_id_label(head_container: pulumi.Resource) -> docker.ContainerLabelArgs:
    """Workers joined this head: a replaced head replaces them too."""
    assert isinstance(head_container, docker.Container)
    return docker.ContainerLabelArgs(label="spark-vllm.ray-head-id", value=head_container.id)


class RayCluster(pulumi.ComponentResource):
    head_container: docker.Container
    worker_containers: list[docker.Container]
    joined: remote.Command

    def __init__(self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:RayCluster", name, None, opts)
        plan = args.plan
        self.head_container = self._container(f"{name}-head", args, args.head, "ray-head", [])
        self.worker_containers = [
            self._container(f"{name}-{w.node.name}", args, w, "ray-worker", [self.head_container])
            for w in args.workers
        ]
        containers = [self.head_container, *self.worker_containers]
        self.joined = remote.Command(
            f"{name}-joined",
            connection=args.head.connection,
            create=args.image_id.apply(
                lambda image_id: script_call(
                    args.head.node,
                    "ray-wait.sh",
                    container=plan.container_name("ray-head"),
                    container_scripts=CONTAINER_SCRIPTS_DIR,
                    expect_ips=",".join(n.fabric_ip for n in plan.nodes),
                    gpus=plan.total_gpus,
                    timeout_seconds=plan.config.timeouts.ray_join_seconds,
                    nodes=log_specs(plan),
                    node_checks=node_check_specs(plan),
                    image_id=image_id,
                    **args.fabric.flags,
                )
            ),
            add_previous_output_in_env=False,
            # A replaced container means a new cluster: wait for it again.
            triggers=[c.id for c in containers],
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=containers,
                custom_timeouts=pulumi.CustomTimeouts(
                    create=f"{plan.config.timeouts.ray_join_seconds // 60 + 5}m"
                ),
            ),
        )
        self.register_outputs({"headContainerId": self.head_container.id})

    def _container(
        self,
        resource_name: str,
        args: RayClusterArgs,
        host: Host,
        role: str,
        after: list[pulumi.Resource],
    ) -> docker.Container:
        node: NodePlan = host.node
        plan = args.plan
        settings = service_container_args(plan, node, role, args.image_id, host.mounts_token)
        if after:
            # Workers joined the old head: a replaced head must replace them too.
            settings["labels"] = [*settings["labels"], _head_id_label(after[0])]
        return docker.Container(
            resource_name,
            name=plan.container_name("ray-head" if node.is_head else "ray-worker"),
            entrypoints=["ray"],
            command=ray_start_args(plan, node),
            **settings,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=host.provider,
                depends_on=[*host.prepared, args.image_ready[node.name], *after],
                # Fixed container names: the old container must go before its replacement starts.
                delete_before_replace=True,
                custom_timeouts=pulumi.CustomTimeouts(create="10m", delete="5m"),
            ),
        )
