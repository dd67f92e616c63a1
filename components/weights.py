"""The model snapshot at the same path on every node, verified by files and bytes."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components.fabric_trust import FabricAccess
from components.host import Host
from components.remote import script_call
from stacks.nodes import DeploymentPlan


@dataclass(frozen=True)
class ModelWeightsArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]
    fabric: FabricAccess
    image_ready: dict[str, pulumi.Resource]  # per node; the fetch runs the serving image
    hf_token: pulumi.Output[str] | None


class ModelWeights(pulumi.ComponentResource):
    """Fetched once on the head (token on stdin), copied to workers over the fabric, verified.

    The inputs name only the model, so changing the image does not touch the weights.
    """

    manifest: pulumi.Output[str]  # "commit files bytes" as the head sees it
    ready: dict[str, pulumi.Resource]

    def __init__(
        self, name: str, args: ModelWeightsArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ModelWeights", name, None, opts)
        plan, head = args.plan, args.head
        model = plan.config.model
        minutes = plan.config.timeouts.weights_transfer_minutes
        fetch = remote.Command(
            f"{name}-fetch",
            connection=head.connection,
            create=script_call(
                head.node,
                "weights-fetch.sh",
                state_dir=head.node.state_dir,
                cache_dir=model.cache_dir,
                model=model.id,
                revision=model.revision,
                timeout_minutes=minutes,
            ),
            # The token is read by the script and never printed (errors mask it), so its
            # diagnostics can be shown; progress bars are turned off in the container.
            stdin=args.hf_token if args.hf_token is not None else "",
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[args.image_ready[head.node.name]],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{minutes + 5}m"),
            ),
        )
        self.manifest = fetch.stdout.apply(lambda out: out.strip().splitlines()[-1])
        self.ready = {head.node.name: fetch}
        for worker in args.workers:
            node = worker.node
            self.ready[node.name] = remote.Command(
                f"{name}-{node.name}-copy",
                connection=head.connection,
                create=self.manifest.apply(
                    lambda manifest, node=node: script_call(  # type: ignore[misc]
                        head.node,
                        "weights-sync.sh",
                        worker=node.name,
                        target=node.fabric_destination,
                        worker_bin=node.bin_dir,
                        cache_dir=model.cache_dir,
                        model=model.id,
                        manifest=manifest,
                        timeout_minutes=minutes,
                        **args.fabric.flags,
                    )
                ),
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # One transfer at a time per worker: both saturate the same fabric link.
                    depends_on=[fetch, worker.scripts, args.image_ready[node.name]],
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{minutes + 5}m"),
                ),
            )
        self.register_outputs({"manifest": self.manifest})
