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
from components.steps import host_step
from stacks.plan import hardware
from stacks.plan.later import (
    GPU_MEMORY_UTILIZATION,
    KV_CACHE_BYTES,
    PINNED_IMAGE,
    WEIGHTS_COMMIT,
    Later,
    consumed,
)
from stacks.plan.nodes import (
    DeploymentPlan,
    ServerSizing,
    checked_sizing,
    server_sizing,
    sizing_values,
)


@dataclass(frozen=True)
class ServerMemoryArgs:
    plan: DeploymentPlan
    head: Host
    image: pulumi.Output[str]  # its pinned name (stacks/plan/image.py pinned_image)
    commit: pulumi.Output[str]  # the head's snapshot's commit (vllm.kvCache sizes from it)
    weights_ready: list[pulumi.Resource]  # the weights (and so the image) on every node


class ServerMemory(pulumi.ComponentResource):
    check: remote.Command
    sizing: pulumi.Output[dict[str, Any]]  # what was measured and chosen (the `memory` output)
    # vLLM's memory flags: the configured ones (known in preview), or with `auto` the check's
    # later values (`chosen`).
    server_sizing: ServerSizing
    chosen: dict[Later, pulumi.Output[str]]

    def __init__(
        self, name: str, args: ServerMemoryArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ServerMemory", name, None, opts)
        plan = args.plan
        self.check = host_step(
            hardware.memory_check(plan, name),
            [args.head],
            parent=self,
            after=args.weights_ready,
            values={PINNED_IMAGE: args.image, WEIGHTS_COMMIT: args.commit},
        )
        self.sizing = self.check.stdout.apply(hardware.parse_memory_sizing)
        self.server_sizing = server_sizing(plan)
        chosen = self.sizing.apply(checked_sizing)
        self.chosen = {
            later: chosen.apply(functools.partial(_chosen, later))
            for later in (GPU_MEMORY_UTILIZATION, KV_CACHE_BYTES)
            if later.name in consumed(*self.server_sizing.flags())
        }
        self.register_outputs({"sizing": self.sizing})


def _chosen(later: Later, sizing: ServerSizing) -> str:
    values = sizing_values(sizing)
    if later.name not in values:
        raise ValueError(
            f"spark-vllm: the memory check chose no {later.name} (its `memory` output)"
        )
    return values[later.name]
