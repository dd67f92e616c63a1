"""The Ray cluster: a container per node with Ray as its main process, then a bounded join wait."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.plan.names import RAY, RAY_HEAD


class RayCluster(pulumi.ComponentResource):
    def __init__(self, walk: Walk, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:RayCluster", RAY, None, opts)
        walk.build(RAY, parent=self)
        self.register_outputs({"headContainerId": walk.container(RAY_HEAD).id})
