"""The head's SSH access to each worker over the fabric, for image and weights transfer.

A key made on the head is authorized on each worker through that worker's own (pinned) connection,
and the worker's host key is pinned on the head under its fabric IP. Destroy removes all three.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components.host import Host
from components.steps import host_step
from stacks.plan import fabric, hardware
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class FabricTrustArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]


class FabricTrust(pulumi.ComponentResource):
    ready: list[pulumi.Resource]  # every worker trusts the head's key and its link was checked
    links: dict[str, remote.Command]  # by worker: fabric-link.sh's figures on stdout

    def __init__(
        self, name: str, args: FabricTrustArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:FabricTrust", name, None, opts)
        plan, head = args.plan, args.head
        trusted = {w.node.name: [head.preflight, w.preflight] for w in args.workers}
        outputs: dict[str, pulumi.Input[object]] = {"managed": False}
        if fabric.fabric_trust_managed(plan):
            head_key = host_step(
                fabric.head_fabric_key(plan, name), [head], parent=self, after=[head.preflight]
            )
            for worker in args.workers:
                authorize = host_step(
                    fabric.authorize_head_key(plan, name, worker.node),
                    [worker],
                    parent=self,
                    after=[worker.preflight],
                    stdin={"head-public-key": head_key.stdout},
                )
                pin = self._pin(plan, name, head, worker, head_key, authorize)
                trusted[worker.node.name] = [pin]
            outputs = {"managed": True, "headPublicKey": head_key.stdout}
        self.links = {
            worker.node.name: host_step(
                hardware.fabric_link(plan, name, worker.node),
                [head],
                parent=self,
                after=[*trusted[worker.node.name], worker.scripts],
            )
            for worker in args.workers
        }
        self.ready = list(self.links.values())
        self.register_outputs({**outputs, "links": [c.stdout for c in self.links.values()]})

    def _pin(
        self,
        plan: DeploymentPlan,
        name: str,
        head: Host,
        worker: Host,
        head_key: remote.Command,
        authorize: remote.Command,
    ) -> remote.Command:
        return host_step(
            fabric.pin_worker_key(plan, name, worker.node),
            [head],
            parent=self,
            after=[authorize, head_key],
            stdin={"worker-host-keys": authorize.stdout},
        )
