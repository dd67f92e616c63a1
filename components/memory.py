"""The memory the server will find on every node, measured once the image and the weights are
there and before Ray or the server starts, and what the server is sized to (the fraction, and
with vllm.kvCache the KV cache's bytes)."""

from __future__ import annotations

from typing import Any

import pulumi

from components.graph import Walk
from stacks.plan import hardware, names


class ServerMemory(pulumi.ComponentResource):
    sizing: pulumi.Output[dict[str, Any]]  # what was measured and chosen (the `memory` output)

    def __init__(
        self, walk: Walk, name: str = names.MEMORY, opts: pulumi.ResourceOptions | None = None
    ):
        """`name`: the server slot's (`memory`, `memory-s1`...)."""
        super().__init__("spark-vllm:index:ServerMemory", name, None, opts)
        walk.build(name, parent=self)
        self.sizing = walk.step(names.check_of(name)).stdout.apply(hardware.parse_memory_sizing)
        self.register_outputs({"sizing": self.sizing})
