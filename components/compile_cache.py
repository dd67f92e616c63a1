"""Each node's compile caches, kept on the host across server replacements (stacks/plan/nodes.py
compile_cache_env, stacks/plan/image.py compile_cache)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.host import Host
from components.steps import host_step
from stacks.plan import image
from stacks.plan.later import PINNED_IMAGE
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class CompileCacheArgs:
    plan: DeploymentPlan
    hosts: list[Host]
    image: pulumi.Output[str]  # pinned name: its delete empties the cache from a container of it
    image_ready: dict[str, pulumi.Resource]  # by node name: the image is there after it


class CompileCache(pulumi.ComponentResource):
    """`ready[node]`: after the image is on the node and its cache is in place; the node's Ray
    and vLLM containers start after it, so a destroy deletes them first and the image last."""

    ready: dict[str, pulumi.Resource]

    def __init__(
        self, name: str, args: CompileCacheArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:CompileCache", name, None, opts)
        self.ready = {
            host.node.name: host_step(
                image.compile_cache(args.plan, name, host.node),
                [host],
                parent=self,
                after=[args.image_ready[host.node.name]],
                values={PINNED_IMAGE: args.image},
            )
            for host in args.hosts
        }
        self.register_outputs({})
