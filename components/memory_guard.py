"""The memory guard on every node: a small container that stops this deployment's newest server
before the host runs out of memory (components/scripts/memory_guard.py)."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.plan.names import MEMORY_GUARD


class MemoryGuard(pulumi.ComponentResource):
    """Every Ray and vLLM container of a node starts after its guard, and is deleted before it."""

    def __init__(self, walk: Walk, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:MemoryGuard", MEMORY_GUARD, None, opts)
        walk.build(MEMORY_GUARD, parent=self)
        self.register_outputs({})
