"""The stack instance (stacks/plan/instance.py): its token, drawn once on the machine that runs
pulumi, kept in the state, never drawn again."""

from __future__ import annotations

import pulumi
from pulumi_command import local

from stacks.plan import names
from stacks.plan.instance import INSTANCE_CREATE, instance_token


class StackInstance(pulumi.ComponentResource):
    """A local Command with no delete, no triggers and nothing that changes: created on the
    first `up` and the same on every run after it. A create that did change (a future release)
    is ignored, not run again: a new token would lock the stack out of its own hosts."""

    def __init__(self, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:StackInstance", names.INSTANCE, None, opts)
        self.token_command = local.Command(
            names.INSTANCE_TOKEN,
            create=INSTANCE_CREATE,
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["create"]),
        )
        self.token: pulumi.Output[str] = self.token_command.stdout.apply(instance_token)
        self.register_outputs({"token": self.token})
