"""The memory the server will find on every node, measured once the image and the weights are
there and before Ray or the server starts, and the fraction the server is sized to."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_command import remote

from components.host import Host
from components.steps import Pending, host_step
from stacks.plan import hardware
from stacks.plan.nodes import DeploymentPlan, fixed_gpu_memory_utilization


@dataclass(frozen=True)
class ServerMemoryArgs:
    plan: DeploymentPlan
    head: Host
    image_id: pulumi.Output[str]
    weights_ready: list[pulumi.Resource]  # the weights (and so the image) on every node


class ServerMemory(pulumi.ComponentResource):
    check: remote.Command
    sizing: pulumi.Output[dict[str, Any]]  # what was measured and chosen (the `memory` output)
    # vLLM's --gpu-memory-utilization: the configured fraction (known in preview), or `auto`'s.
    gpu_memory_utilization: str | pulumi.Output[str]

    def __init__(
        self, name: str, args: ServerMemoryArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ServerMemory", name, None, opts)
        plan = args.plan
        self.check = host_step(
            Pending(args.image_id, functools.partial(hardware.memory_check, plan, name)),
            [args.head],
            parent=self,
            after=args.weights_ready,
        )
        self.sizing = self.check.stdout.apply(hardware.parse_memory_sizing)
        fixed = fixed_gpu_memory_utilization(plan)
        self.gpu_memory_utilization = (
            fixed
            if fixed is not None
            else self.sizing.apply(lambda sizing: str(sizing["gpuMemoryUtilization"]))
        )
        self.register_outputs({"sizing": self.sizing})
