"""The model snapshot at the same path on every node, verified by files and bytes."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.fleet import ServedModel
from stacks.plan import names, weights
from stacks.plan.graph import fetched_manifest
from stacks.plan.server_plan import per_server


class ModelWeights(pulumi.ComponentResource):
    """Fetched once on the head (token on stdin), copied to workers over the fabric, verified.

    The inputs name only the model, so changing the image does not touch the weights.
    """

    manifest: pulumi.Output[str]  # "commit files bytes" as the head sees it

    def __init__(
        self, walk: Walk, name: str = names.WEIGHTS, opts: pulumi.ResourceOptions | None = None
    ):
        """`name`: the model's server slot's (`weights`, `weights-s1`...)."""
        super().__init__("spark-vllm:index:ModelWeights", name, None, opts)
        walk.build(name, parent=self)
        self.manifest = walk.step(names.fetch_of(name)).stdout.apply(fetched_manifest)
        served = next(p.served for p in per_server(walk.plan) if names.weights_of(p.slot) == name)
        self.manifest.apply(lambda manifest: _warn_if_unpinned(served, manifest))
        self.register_outputs({"manifest": self.manifest})


def _warn_if_unpinned(served: ServedModel, manifest: str) -> None:
    warning = weights.unpinned_revision_warning(served, manifest)
    if warning is not None:
        pulumi.log.warn(warning)
