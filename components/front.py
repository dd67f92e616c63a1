"""The front on the head: HAProxy publishing `vllm.port`, admitting only requests that carry the
API key (stacks/plan/front.py), from an image pulled on the head; and the key's files it and the
server read."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.containers import service_container
from components.host import Host
from components.steps import host_step
from stacks.plan import hosts, image, server
from stacks.plan.containers import API_KEY_HASH_LABEL, front_container
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class FrontArgs:
    plan: DeploymentPlan
    head: Host
    api_key: pulumi.Output[str]  # a secret, never empty
    checked: pulumi.Resource  # the last check (ServerMemory): nothing starts before it passed


class Front(pulumi.ComponentResource):
    key_file: remote.Command  # the key (for vLLM) and its pattern file (for the front)
    container: docker.Container
    image_digest: pulumi.Output[str]  # the pulled front image's repo digest (README, Outputs)

    def __init__(self, name: str, args: FrontArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:Front", name, None, opts)
        plan, head = args.plan, args.head
        self.key_file = host_step(
            server.api_key_file(plan, name),
            [head],
            parent=self,
            after=[head.scripts],
            stdin={"api-key": args.api_key},
            # Before this release the server's component held it: the same step, not a new one
            # whose predecessor's delete would remove the key after it was written.
            aliases=[
                pulumi.Alias(
                    name="vllm-api-key",
                    parent=pulumi.create_urn("vllm", "spark-vllm:index:VllmServer"),
                )
            ],
        )
        config = host_step(hosts.write_front_config(plan, name), [head], parent=self,
                           after=[head.scripts])  # fmt: skip
        pull = image.front_image_pull(plan)
        pulled = docker.RemoteImage(
            f"{name}-pull",
            name=pull.ref,
            platform=pull.platform,
            keep_locally=pull.keep_locally,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=head.provider,
                depends_on=[head.preflight],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{pull.timeout_minutes}m"),
            ),
        )
        self.image_digest = pulled.repo_digest
        self.container = service_container(
            f"{name}-container",
            front_container(plan, head.mounts_token),
            pulled.image_id,
            provider=head.provider,
            parent=self,
            after=[*head.prepared, config, self.key_file, args.checked],
            # A new key must restart the front (it loads the pattern file at start).
            id_labels=[(API_KEY_HASH_LABEL, args.api_key.apply(_sha256))],
        )
        self.register_outputs({"containerId": self.container.id, "imageDigest": self.image_digest})


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16] if value else "none"
