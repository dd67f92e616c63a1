"""The firewall on every host: a guard container that holds the cluster's rules (and puts them
back at boot), then a step that waits until they hold (stacks/plan/firewall.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker

from components.bundle import entry_scripts
from components.containers import service_container
from components.host import Host
from components.steps import host_step
from stacks.plan import hosts
from stacks.plan.containers import firewall_container
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class FirewallArgs:
    plan: DeploymentPlan
    hosts: list[Host]
    image: pulumi.Output[str]  # the serving image's pinned name: the guard runs from it
    image_ready: dict[str, pulumi.Resource]  # by node name
    checked: pulumi.Resource  # the last check (ServerMemory): nothing starts before it passed


class Firewall(pulumi.ComponentResource):
    """`ready[node]`: the step after which that node's rules hold; every Ray and vLLM container
    of the node starts after it (and, at each start, through the gate)."""

    guards: dict[str, docker.Container]
    ready: dict[str, pulumi.Resource]

    def __init__(self, name: str, args: FirewallArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Firewall", name, None, opts)
        plan = args.plan
        self.guards, self.ready = {}, {}
        for host in args.hosts:
            node = host.node
            step = hosts.firewall(plan, name, node)
            if step is None:
                continue
            guard = service_container(
                f"{name}-{node.name}-guard",
                firewall_container(plan, node, host.mounts_token, entry_scripts()),
                args.image,
                provider=host.provider,
                parent=self,
                after=[*host.prepared, args.image_ready[node.name], args.checked],
            )
            self.guards[node.name] = guard
            # Not replaced with its guard (a new image replaces the guard): the old step's
            # delete would take the rules down after the new one waited. A new guard's rules
            # are awaited by the gate of every container that starts after it.
            self.ready[node.name] = host_step(step, [host], parent=self, after=[guard])
        self.register_outputs({})
