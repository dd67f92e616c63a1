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
from stacks.plan import steps
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class FabricTrustArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]


class FabricTrust(pulumi.ComponentResource):
    ready: list[pulumi.Resource]  # every worker trusts the head's key, pinned on the head

    def __init__(
        self, name: str, args: FabricTrustArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:FabricTrust", name, None, opts)
        plan, head = args.plan, args.head
        self.ready = []
        if not steps.fabric_trust_managed(plan):
            self.register_outputs({"managed": False})
            return
        head_key = host_step(
            steps.head_fabric_key(plan, name), [head], parent=self, after=[head.preflight]
        )
        for worker in args.workers:
            authorize = host_step(
                steps.authorize_head_key(plan, name, worker.node),
                [worker],
                parent=self,
                after=[worker.preflight],
                stdin={"head-public-key": head_key.stdout},
            )
            self.ready.append(self._pin(plan, name, head, worker, head_key, authorize))
        self.register_outputs({"managed": True, "headPublicKey": head_key.stdout})

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
            steps.pin_worker_key(plan, name, worker.node),
            [head],
            parent=self,
            after=[authorize, head_key],
            stdin={"worker-host-keys": authorize.stdout},
        )
