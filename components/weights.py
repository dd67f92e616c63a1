"""The model snapshot at the same path on every node, verified by files and bytes."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pulumi

from components.host import Host
from components.steps import head_to_workers, host_step
from stacks.plan import fabric, weights
from stacks.plan.later import WEIGHTS_COMMIT, Later
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class ModelWeightsArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]
    image_ready: dict[str, pulumi.Resource]  # per node; the fetch runs the serving image
    hf_token: pulumi.Output[str] | None


class ModelWeights(pulumi.ComponentResource):
    """Fetched once on the head (token on stdin), copied to workers over the fabric, verified.

    The inputs name only the model, so changing the image does not touch the weights.
    """

    manifest: pulumi.Output[str]  # "commit files bytes" as the head sees it
    commit: pulumi.Output[str]  # the snapshot's commit, the manifest's first field
    values: dict[Later, pulumi.Output[str]]  # the manifest's fields, as the copies consume them
    present_on: dict[str, pulumi.Resource]  # node name -> the step after which it has the snapshot

    def __init__(
        self, name: str, args: ModelWeightsArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ModelWeights", name, None, opts)
        plan, head = args.plan, args.head
        fetch = host_step(
            weights.fetch_weights(plan, name),
            [head],
            parent=self,
            after=[args.image_ready[head.node.name]],
            stdin={"hf-token": args.hf_token if args.hf_token is not None else ""},
        )
        self.manifest = fetch.stdout.apply(lambda out: out.strip().splitlines()[-1])
        fields = self.manifest.apply(weights.manifest_values)
        self.values = {
            later: fields.apply(functools.partial(_field, later.name))
            for later in weights.MANIFEST_FIELDS
        }
        self.commit = self.values[WEIGHTS_COMMIT]
        self.present_on = {
            head.node.name: fetch,
            **head_to_workers(
                functools.partial(weights.copy_weights, plan, name),
                head,
                args.workers,
                parent=self,
                # One transfer at a time per worker: both saturate the same fabric link.
                after=lambda worker: [fetch, worker.scripts, args.image_ready[worker.node.name]],
                values=self.values,
                relay_leader=fabric.relay_leader(plan),
            ),
        }
        self.register_outputs({"manifest": self.manifest})


def _field(name: str, fields: dict[str, str]) -> str:
    return fields[name]
