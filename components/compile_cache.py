"""Each node's compile caches, kept on the host across server replacements
(stacks/plan/arguments.py compile_cache_env, stacks/plan/image.py compile_cache)."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.plan.names import COMPILE_CACHE


class CompileCache(pulumi.ComponentResource):
    """A step per node, after its image: its Ray and vLLM containers start after it, so a
    destroy deletes them first and the image last."""

    def __init__(self, walk: Walk, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:CompileCache", COMPILE_CACHE, None, opts)
        walk.build(COMPILE_CACHE, parent=self)
        self.register_outputs({})
