"""The serving image: pulled once on the head, streamed to each worker over the fabric."""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.fabric_trust import FabricAccess
from components.facts import check
from components.host import Host
from components.remote import QUICK_STEP, script_call
from stacks.nodes import DeploymentPlan, NodePlan


@dataclass(frozen=True)
class ImageDistributionArgs:
    plan: DeploymentPlan
    head: Host
    workers: list[Host]
    fabric: FabricAccess


class ImageDistribution(pulumi.ComponentResource):
    """Every node ends up with the same image ID; a worker that has it already is skipped.

    Steps re-run only when the image ID changes, so a moved tag is a real diff in preview.
    """

    image_id: pulumi.Output[str]
    present_on: dict[str, pulumi.Resource]  # node name -> the step after which it has the image

    def __init__(
        self, name: str, args: ImageDistributionArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("spark-vllm:index:ImageDistribution", name, None, opts)
        plan, head = args.plan, args.head
        image_cfg = plan.config.image
        pulled = docker.RemoteImage(
            f"{name}-pull",
            name=image_cfg.ref,
            platform=image_cfg.platform,
            keep_locally=image_cfg.keep_on_destroy,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=head.provider,
                depends_on=[head.preflight],
                # Its delete removes the image (keepLocally false): a replacement created first
                # could be that very image (a tag moved to the same ID), so delete it first.
                delete_before_replace=not image_cfg.keep_on_destroy,
                custom_timeouts=pulumi.CustomTimeouts(
                    create=f"{plan.config.timeouts.image_transfer_minutes}m"
                ),
            ),
        )
        self.image_id = pulled.image_id
        record_step = f"{name}-head-record"
        record_file = f"{head.node.state_dir}/image-id"
        recorded = remote.Command(
            record_step,
            connection=head.connection,
            create=self.image_id.apply(
                lambda image_id: head.recorded(
                    script_call(
                        head.node,
                        "image-record.sh",
                        state_dir=head.node.state_dir,
                        image_id=image_id,
                        ref=image_cfg.ref,
                    ),
                    record_step,
                    check("files", record_file),
                    check("image", image_id),
                )
            ),
            delete=f"rm -f {shlex.quote(record_file)}",
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[pulled], custom_timeouts=QUICK_STEP
            ),
        )
        self.present_on = {head.node.name: recorded}
        minutes = plan.config.timeouts.image_transfer_minutes
        for worker in args.workers:
            node = worker.node
            sync_step = f"{name}-{node.name}-sync"
            self.present_on[node.name] = remote.Command(
                sync_step,
                connection=head.connection,
                create=self.image_id.apply(
                    lambda image_id, worker=worker, step=sync_step: head.recorded_for(  # type: ignore[misc]
                        worker,
                        _sync_command(plan, head.node, worker.node, args.fabric.flags, image_id),
                        step,
                        args.fabric.flags,
                        check("image", image_id),
                    )
                ),
                delete=None
                if image_cfg.keep_on_destroy
                else self.image_id.apply(
                    functools.partial(_remove_command, plan, head.node, node, args.fabric.flags)
                ),
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[recorded, worker.preflight, *args.fabric.ready],
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{minutes + 5}m"),
                ),
            )
        self.register_outputs({"imageId": self.image_id})


def _sync_command(
    plan: DeploymentPlan, head: NodePlan, worker: NodePlan, fabric: dict[str, str], image_id: str
) -> str:
    return script_call(
        head,
        "image-sync.sh",
        worker=worker.name,
        target=worker.fabric_destination,
        image_id=image_id,
        ref=plan.config.image.ref,
        timeout_minutes=plan.config.timeouts.image_transfer_minutes,
        compress="zstd",
        **fabric,
    )


def _remove_command(
    plan: DeploymentPlan, head: NodePlan, worker: NodePlan, fabric: dict[str, str], image_id: str
) -> str:
    return _sync_command(plan, head, worker, fabric, image_id) + " --remove yes"
