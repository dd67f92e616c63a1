"""The model snapshot at the same path on every node, verified by files and bytes."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components.fabric_trust import FabricAccess
from components.facts import check
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
    present_on: dict[str, pulumi.Resource]  # node name -> the step after which it has the snapshot

    def __init__(
        self, name: str, args: ModelWeightsArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ModelWeights", name, None, opts)
        plan, head = args.plan, args.head
        model = plan.config.model
        minutes = plan.config.timeouts.weights_transfer_minutes
        fetch_step = f"{name}-fetch"
        fetch = remote.Command(
            fetch_step,
            connection=head.connection,
            create=head.recorded(
                script_call(
                    head.node,
                    "weights-fetch.sh",
                    state_dir=head.node.state_dir,
                    cache_dir=model.cache_dir,
                    model=model.id,
                    revision=model.revision,
                    timeout_minutes=minutes,
                ),
                fetch_step,
                check("snapshot", model.cache_dir, model.id, model.revision),
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
        self.present_on = {head.node.name: fetch}
        for worker in args.workers:
            node = worker.node
            copy_step = f"{name}-{node.name}-copy"
            self.present_on[node.name] = remote.Command(
                copy_step,
                connection=head.connection,
                create=self.manifest.apply(
                    lambda manifest, worker=worker, step=copy_step: head.recorded_for(  # type: ignore[misc]
                        worker,
                        script_call(
                            head.node,
                            "weights-sync.sh",
                            worker=worker.node.name,
                            target=worker.node.fabric_destination,
                            worker_bin=worker.node.bin_dir,
                            cache_dir=model.cache_dir,
                            model=model.id,
                            manifest=manifest,
                            timeout_minutes=minutes,
                            **args.fabric.flags,
                        ),
                        step,
                        args.fabric.flags,
                        check("snapshot", model.cache_dir, model.id, manifest.split()[0]),
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
