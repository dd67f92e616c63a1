"""The vLLM server on the head, joined to the Ray cluster, and its readiness check."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.containers import service_container_args
from components.fabric_trust import FabricAccess
from components.facts import check
from components.host import Host
from components.ray_cluster import RayCluster
from components.remote import QUICK_STEP, SCRIPTS_DIR, script_call
from stacks.nodes import (
    CONTAINER_API_KEY_DIR,
    CONTAINER_SCRIPTS_DIR,
    DeploymentPlan,
    log_specs,
    node_check_specs,
    vllm_launcher_args,
)


@dataclass(frozen=True)
class VllmServerArgs:
    plan: DeploymentPlan
    head: Host
    image_id: pulumi.Output[str]
    ray: RayCluster
    weights_ready: list[pulumi.Resource]
    fabric: FabricAccess
    api_key: pulumi.Output[str]  # a secret, never empty


class VllmServer(pulumi.ComponentResource):
    container: docker.Container
    readiness: remote.Command  # the served model answered a real completion

    def __init__(self, name: str, args: VllmServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:VllmServer", name, None, opts)
        plan, head = args.plan, args.head
        key_step = f"{name}-api-key"
        key_file = remote.Command(
            key_step,
            connection=head.connection,
            create=head.recorded(
                script_call(head.node, "api-key-file.sh", "write", file=plan.api_key_file),
                key_step,
                check("files", plan.api_key_file),
            ),
            delete=script_call(head.node, "api-key-file.sh", "remove", file=plan.api_key_file),
            stdin=args.api_key,
            logging=remote.Logging.NONE,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[head.scripts], custom_timeouts=QUICK_STEP
            ),
        )
        settings = service_container_args(plan, head.node, "vllm", args.image_id, head.mounts_token)
        settings["mounts"] = [
            *settings["mounts"],
            docker.ContainerMountArgs(
                type="bind", source=plan.api_key_dir, target=CONTAINER_API_KEY_DIR, read_only=True
            ),
        ]
        settings["labels"] = [
            *settings["labels"],
            # The cluster it joined: any Ray container replaced (a new head, or a worker
            # recreated after a refresh found it gone) replaces the wait, and so the server.
            docker.ContainerLabelArgs(label="spark-vllm.ray-cluster", value=args.ray.joined.id),
            # A new key must restart vLLM, but only its hash may appear in the container's config.
            docker.ContainerLabelArgs(
                label="spark-vllm.api-key-sha256",
                value=args.api_key.apply(_sha256),  # stays secret: derived from a secret
            ),
        ]
        launcher = (SCRIPTS_DIR / "vllm-launcher.sh").read_text()
        self.container = docker.Container(
            f"{name}-container",
            name=plan.container_name("vllm"),
            entrypoints=["bash", "-c", launcher, "vllm-launcher"],
            command=vllm_launcher_args(plan),
            **settings,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=head.provider,
                depends_on=[args.ray.joined, key_file, *args.weights_ready],
                delete_before_replace=True,
                custom_timeouts=pulumi.CustomTimeouts(create="10m", delete="5m"),
            ),
        )
        timeout = plan.config.timeouts.vllm_ready_seconds
        self.readiness = remote.Command(
            f"{name}-ready",
            connection=head.connection,
            create=args.image_id.apply(
                lambda image_id: script_call(
                    head.node,
                    "vllm-ready.sh",
                    container=plan.container_name("vllm"),
                    container_scripts=CONTAINER_SCRIPTS_DIR,
                    port=plan.config.vllm.port,
                    served_name=plan.config.model.served_model_name,
                    timeout_seconds=timeout,
                    nodes=log_specs(plan, include_vllm=True),
                    node_checks=node_check_specs(plan),
                    image_id=image_id,
                    model=plan.config.model.id,
                    revision=plan.config.model.revision,
                    cache_dir=plan.config.model.cache_dir,
                    **args.fabric.flags,
                )
            ),
            stdin=args.api_key,  # read by the script, never printed: its diagnostics can be shown
            add_previous_output_in_env=False,
            triggers=[self.container.id],
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.container],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{timeout // 60 + 5}m"),
            ),
        )
        self.register_outputs({"containerId": self.container.id, "ready": self.readiness.stdout})


def _sha256(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()[:16] if value else "none"
