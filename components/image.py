"""The serving image: pulled once on the head, streamed to each worker over the fabric."""

from __future__ import annotations

import pulumi

from components.graph import Walk
from stacks.plan import image
from stacks.plan.later import IMAGE_ID, PINNED_IMAGE
from stacks.plan.names import IMAGE, image_facts_of, image_pull_of, retained_on
from stacks.plan.ray_versions import ray_layout_warning


class ImageDistribution(pulumi.ComponentResource):
    """Every node ends up with the same image, by content, under one pinned name; a worker
    that has it already is skipped.

    Steps re-run only when the image ID changes, so a moved tag is a real diff in preview.
    """

    image_id: pulumi.Output[str]
    repo_digest: pulumi.Output[str]  # what the head pulled, `repo@sha256:...` ("" if never pulled)
    pinned: pulumi.Output[str]  # its name on every node (stacks/plan/image.py pinned_image)
    facts: pulumi.Output[dict[str, str]]  # what the image carries (vllm, ray, python, machine)
    held: dict[str, pulumi.Output[list[str]]]  # by node: the images it keeps, newest first

    def __init__(
        self, walk: Walk, component: str = IMAGE, opts: pulumi.ResourceOptions | None = None
    ):
        # image.ref's: `image`; an entry's own: `image-i<hash>`
        stream = next(s for s in image.image_streams(walk.plan) if s.component == component)
        super().__init__("spark-vllm:index:ImageDistribution", component, None, opts)
        plan = walk.plan
        walk.build(component, parent=self)
        pulled = walk.pulled(image_pull_of(component))
        self.image_id = walk.value(stream.later(IMAGE_ID).name)
        self.repo_digest = pulled.repo_digest
        self.pinned = walk.value(stream.later(PINNED_IMAGE).name)
        # Each node runs the image once before anything starts from it (image-facts.sh).
        facts = walk.step(image_facts_of(plan.head.name, component)).stdout
        self.facts = facts.apply(image.parse_image_facts)
        if any(model.settings.executor == "ray" for model in stream.models):
            self.facts.apply(_warn_about_ray)
        self.held = {
            node.name: walk.step(retained_on(node.name, component)).stdout.apply(
                image.parse_retained
            )
            for node in stream.nodes
        }
        self.register_outputs(
            {
                "imageId": self.image_id,
                "imageDigest": self.repo_digest,
                "pinned": self.pinned,
                "facts": self.facts,
            }
        )


def _warn_about_ray(facts: dict[str, str]) -> None:
    """A Ray newer than the layout was checked with (stacks/plan/ray_versions.py)."""
    warning = ray_layout_warning(facts["ray"]) if "ray" in facts else None
    if warning is not None:
        pulumi.log.warn(warning)
