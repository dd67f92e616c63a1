"""The vLLM server on the head, joined to the Ray cluster, and its readiness check."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.bundle import launcher_script
from components.containers import service_container
from components.host import Host
from components.ray_cluster import RayCluster
from components.steps import PENDING, Pending, host_step
from stacks.plan import steps
from stacks.plan.containers import API_KEY_HASH_LABEL, RAY_CLUSTER_LABEL, vllm_container
from stacks.plan.nodes import DeploymentPlan


@dataclass(frozen=True)
class VllmServerArgs:
    plan: DeploymentPlan
    head: Host
    image_id: pulumi.Output[str]
    ray: RayCluster
    weights_ready: list[pulumi.Resource]
    api_key: pulumi.Output[str]  # a secret, never empty
    gpu_memory_utilization: str | pulumi.Output[str]  # configured, or what the memory check derived


class VllmServer(pulumi.ComponentResource):
    container: docker.Container
    readiness: remote.Command  # the served model answered a real completion
    fabric_transport: pulumi.Output[str]  # which network NCCL chose (README, Outputs)

    def __init__(self, name: str, args: VllmServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spark-vllm:index:VllmServer", name, None, opts)
        plan, head = args.plan, args.head
        key_file = host_step(
            steps.api_key_file(plan, name),
            [head],
            parent=self,
            after=[head.scripts],
            stdin={"api-key": args.api_key},
        )
        spec = functools.partial(vllm_container, plan, head.mounts_token, launcher_script())
        utilization = args.gpu_memory_utilization
        self.container = service_container(
            f"{name}-container",
            spec(utilization if isinstance(utilization, str) else PENDING),
            args.image_id,
            # With `auto`, the fraction is known once the memory check ran.
            command=None
            if isinstance(utilization, str)
            else utilization.apply(lambda u: list(spec(u).command)),
            provider=head.provider,
            parent=self,
            after=[args.ray.joined, key_file, *args.weights_ready],
            id_labels=[
                # The cluster it joined: any Ray container replaced (a new head, or a worker
                # recreated after a refresh found it gone) replaces the wait, and the server.
                (RAY_CLUSTER_LABEL, args.ray.joined.id),
                # A new key must restart vLLM; only its hash (still a secret) is in the config.
                (API_KEY_HASH_LABEL, args.api_key.apply(_sha256)),
            ],
        )
        self.readiness = host_step(
            Pending(args.image_id, functools.partial(steps.vllm_ready, plan, name)),
            [head],
            parent=self,
            after=[self.container],
            stdin={"api-key": args.api_key},
            triggers=[self.container.id],
        )
        self.fabric_transport = self.readiness.stdout.apply(
            functools.partial(_checked_transport, expected_rdma=plan.expects_rdma)
        )
        self.register_outputs({"containerId": self.container.id, "ready": self.readiness.stdout})


def _checked_transport(readiness: str, expected_rdma: bool) -> str:
    """The transport NCCL chose; a loud warning in the `pulumi up` output when hosts have HCAs
    but NCCL did not use them."""
    found = steps.parse_fabric_transport(readiness)
    if expected_rdma and not found.startswith("ib"):
        pulumi.log.warn(
            f"NCCL is not using RDMA between the nodes (fabricTransport: {found}): "
            "tensor-parallel decode is then several times slower; check hosts[].rdmaHcas "
            "(ibv_devinfo), the RoCE link, and the image's NCCL (README, Failures)"
        )
    return found


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16] if value else "none"
