"""The head's SSH access to each worker over the fabric, for image and weights transfer.

A key made on the head is authorized on each worker through that worker's own (pinned) connection,
and the worker's host key is pinned on the head under its fabric IP. Destroy removes all three.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components.facts import check
from components.host import Host
from components.remote import QUICK_STEP, script_call
from stacks.known_hosts import known_hosts_name
from stacks.nodes import DeploymentPlan, NodePlan


@dataclass(frozen=True)
class FabricAccess:
    """What a head-side step needs to reach workers: flags for lib.sh's fabric_ssh."""

    flags: dict[str, str]
    ready: list[pulumi.Resource]  # every worker trusts the head's key, pinned on the head


@dataclass(frozen=True)
class FabricTrustArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]


class FabricTrust(pulumi.ComponentResource):
    access: FabricAccess

    def __init__(
        self, name: str, args: FabricTrustArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:FabricTrust", name, None, opts)
        plan, head = args.plan, args.head
        if plan.config.fabric.trust == "existing" or not args.workers:
            self.access = FabricAccess(flags={}, ready=[])
            self.register_outputs({"managed": False})
            return
        marker = f"spark-vllm-fabric:{plan.deployment_id}:{head.node.name}"
        key_flags = {"state_dir": head.node.state_dir, "comment": marker}
        key_step = f"{name}-head-key"
        key_file = f"{head.node.state_dir}/fabric_ed25519"
        known_hosts = f"{head.node.state_dir}/fabric_known_hosts"
        head_key = remote.Command(
            key_step,
            connection=head.connection,
            create=head.recorded(
                script_call(head.node, "fabric-key.sh", "ensure", **key_flags),
                key_step,
                check("files", key_file, f"{key_file}.pub"),
            ),
            delete=script_call(head.node, "fabric-key.sh", "remove", **key_flags),
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[head.preflight], custom_timeouts=QUICK_STEP
            ),
        )
        ready: list[pulumi.Resource] = []
        for worker in args.workers:
            ready.append(self._trust_worker(name, head, worker, head_key, marker, known_hosts))
        self.access = FabricAccess(
            flags={"fabric_key": key_file, "fabric_known_hosts": known_hosts},
            ready=ready,
        )
        self.register_outputs({"managed": True, "headPublicKey": head_key.stdout})

    def _trust_worker(
        self,
        name: str,
        head: Host,
        worker: Host,
        head_key: remote.Command,
        marker: str,
        known_hosts: str,
    ) -> remote.Command:
        node: NodePlan = worker.node
        authorize_step = f"{name}-{node.name}-authorize"
        authorize = remote.Command(
            authorize_step,
            connection=worker.connection,
            create=worker.recorded(
                script_call(node, "authorize-key.sh", "add", marker=marker),
                authorize_step,
                check("authorized", marker),
            ),
            delete=script_call(node, "authorize-key.sh", "remove", marker=marker),
            stdin=head_key.stdout,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[worker.preflight], custom_timeouts=QUICK_STEP
            ),
        )
        address = known_hosts_name(node.fabric_ip, node.ssh.port)
        pin_flags: dict[str, str] = {"state_dir": head.node.state_dir, "address": address}
        pinned = node.ssh.host_key
        pin_step = f"{name}-{node.name}-pin"
        return remote.Command(
            pin_step,
            connection=head.connection,
            create=head.recorded(
                script_call(
                    head.node,
                    "pin-host-key.sh",
                    "add",
                    **pin_flags,
                    **({"key": pinned} if pinned else {}),
                ),
                pin_step,
                check("known-host", known_hosts, address),
            ),
            delete=script_call(head.node, "pin-host-key.sh", "remove", **pin_flags),
            # The configured pin wins; otherwise the keys the worker printed over its own
            # authenticated connection (never a trust-on-first-use scan over the fabric).
            stdin=None if pinned else authorize.stdout,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[authorize, head_key], custom_timeouts=QUICK_STEP
            ),
        )
