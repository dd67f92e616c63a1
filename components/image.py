"""The serving image: pulled once on the head, streamed to each worker over the fabric."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker

from components.host import Host
from components.steps import head_to_workers, host_step
from stacks.plan import fabric, image
from stacks.plan.later import IMAGE_ID, PINNED_IMAGE
from stacks.plan.nodes import DeploymentPlan
from stacks.plan.ray_versions import ray_layout_warning


@dataclass(frozen=True)
class ImageDistributionArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]
    fabric_ready: list[pulumi.Resource]


class ImageDistribution(pulumi.ComponentResource):
    """Every node ends up with the same image, by content, under one pinned name; a worker
    that has it already is skipped.

    Steps re-run only when the image ID changes, so a moved tag is a real diff in preview.
    """

    image_id: pulumi.Output[str]
    repo_digest: pulumi.Output[str]  # what the head pulled, `repo@sha256:...` ("" if never pulled)
    pinned: pulumi.Output[str]  # its name on every node (stacks/plan/image.py pinned_image)
    present_on: dict[str, pulumi.Resource]  # node name -> the step after which it has the image
    facts: pulumi.Output[dict[str, str]]  # what the image carries (vllm, ray, python, machine)

    def __init__(
        self, name: str, args: ImageDistributionArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ImageDistribution", name, None, opts)
        plan, head = args.plan, args.head
        pull = image.image_pull(plan)
        pulled = docker.RemoteImage(
            f"{name}-pull",
            name=pull.ref,
            platform=pull.platform,
            keep_locally=pull.keep_locally,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=head.provider,
                depends_on=[head.preflight],
                # Its delete removes the image (keepLocally false): a replacement created first
                # could be that very image (a tag moved to the same ID), so delete it first.
                delete_before_replace=not pull.keep_locally,
                custom_timeouts=pulumi.CustomTimeouts(create=f"{pull.timeout_minutes}m"),
            ),
        )
        self.image_id = pulled.image_id
        self.repo_digest = pulled.repo_digest
        pulumi.Output.all(pulled.name, pulled.repo_digest).apply(_warn_if_unpinned)
        self.pinned = self.image_id.apply(image.pinned_image)
        values = {IMAGE_ID: self.image_id, PINNED_IMAGE: self.pinned}
        recorded = host_step(
            image.record_image(plan, name), [head], parent=self, after=[pulled], values=values
        )
        synced: dict[str, pulumi.Resource] = {
            head.node.name: recorded,
            **head_to_workers(
                functools.partial(image.sync_image, plan, name),
                head,
                args.workers,
                parent=self,
                after=lambda worker: [recorded, worker.preflight, *args.fabric_ready],
                values=values,
                relay_leader=fabric.relay_leader(plan),
            ),
        }
        # Each node runs the image once before anything starts from it (image-facts.sh).
        checked = {
            host.node.name: host_step(
                image.image_facts(plan, name, host.node),
                [host],
                parent=self,
                after=[synced[host.node.name]],
                values={PINNED_IMAGE: self.pinned},
            )
            for host in [head, *args.workers]
        }
        self.present_on = dict(checked)
        self.facts = checked[head.node.name].stdout.apply(image.parse_image_facts)
        if plan.uses_ray:
            self.facts.apply(_warn_about_ray)
        self.register_outputs(
            {
                "imageId": self.image_id,
                "imageDigest": self.repo_digest,
                "pinned": self.pinned,
                "facts": self.facts,
            }
        )


def _warn_if_unpinned(name_and_digest: list[str]) -> None:
    """A bare tag as image.ref: the exact digest to pin it to (stacks/plan/image.py)."""
    warning = image.unpinned_warning(*name_and_digest)
    if warning is not None:
        pulumi.log.warn(warning)


def _warn_about_ray(facts: dict[str, str]) -> None:
    """A Ray newer than the layout was checked with (stacks/plan/ray_versions.py)."""
    warning = ray_layout_warning(facts["ray"]) if "ray" in facts else None
    if warning is not None:
        pulumi.log.warn(warning)
