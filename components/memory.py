"""The memory the server will find on every node, measured once the image and the weights are
there and before Ray or the server starts, and what the server is sized to (the fraction, and
with vllm.kvCache the KV cache's bytes)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_command import remote

from components.host import Host
from components.steps import Pending, host_step
from stacks.plan import hardware
from stacks.plan.nodes import DeploymentPlan, ServerSizing, checked_sizing, fixed_sizing


@dataclass(frozen=True)
class ServerMemoryArgs:
    plan: DeploymentPlan
    head: Host
    image: pulumi.Output[str]  # its pinned name (stacks/plan/image.py pinned_image)
    manifest: pulumi.Output[str]  # the head's snapshot, "commit files bytes" (vllm.kvCache)
    weights_ready: list[pulumi.Resource]  # the weights (and so the image) on every node


class ServerMemory(pulumi.ComponentResource):
    check: remote.Command
    sizing: pulumi.Output[dict[str, Any]]  # what was measured and chosen (the `memory` output)
    # vLLM's memory flags: the configured ones (known in preview), or what `auto` derived.
    server_sizing: ServerSizing | pulumi.Output[ServerSizing]

    def __init__(
        self, name: str, args: ServerMemoryArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ServerMemory", name, None, opts)
        plan = args.plan
        self.check = host_step(
            Pending(
                _check_value(plan, args), functools.partial(hardware.memory_check_for, plan, name)
            ),
            [args.head],
            parent=self,
            after=args.weights_ready,
        )
        self.sizing = self.check.stdout.apply(hardware.parse_memory_sizing)
        fixed = fixed_sizing(plan)
        self.server_sizing = fixed if fixed is not None else self.sizing.apply(checked_sizing)
        self.register_outputs({"sizing": self.sizing})


def _check_value(plan: DeploymentPlan, args: ServerMemoryArgs) -> pulumi.Output[str]:
    """What the check's command lines need once known: the image's pinned name, and the
    snapshot's commit when the check sizes the KV cache (a stack without vllm.kvCache keeps
    its command)."""
    if not hardware.sizes_kv_cache(plan):
        return args.image
    return pulumi.Output.all(args.image, args.manifest).apply(
        lambda values: hardware.memory_check_value(values[0], values[1])
    )
