"""The composition of one deployment: hosts -> fabric trust -> image and weights -> Ray -> vLLM."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pulumi

from components.fabric_trust import FabricTrust, FabricTrustArgs
from components.host import Host, HostArgs
from components.image import ImageDistribution, ImageDistributionArgs
from components.ray_cluster import RayCluster, RayClusterArgs
from components.remote import SshAuth
from components.vllm_server import VllmServer, VllmServerArgs
from components.weights import ModelWeights, ModelWeightsArgs
from stacks.config import SshConfig
from stacks.known_hosts import write_known_hosts
from stacks.nodes import DeploymentPlan, plan_deployment, unpinned_endpoints
from stacks.settings import Settings


@dataclass(frozen=True)
class Deployment:
    plan: DeploymentPlan
    hosts: dict[str, Host]
    image: ImageDistribution
    weights: ModelWeights
    ray: RayCluster
    server: VllmServer
    api_key: pulumi.Output[str]

    def outputs(self) -> dict[str, object]:
        plan = self.plan
        outputs: dict[str, object] = {
            # Resolves only once the server answered a real completion.
            "endpointUrl": self.server.readiness.stdout.apply(lambda _: plan.endpoint_url),
            "modelId": plan.config.model.served_model_name,
            "head": {"name": plan.head.name, "address": plan.head.ssh.address},
            "nodes": [
                {"name": n.name, "role": n.role, "fabricIp": n.fabric_ip, "gpus": n.gpus}
                for n in plan.nodes
            ],
            "imageId": self.image.image_id,
            "readiness": self.server.readiness.stdout.apply(lambda out: out.strip()),
        }
        outputs["apiKey"] = self.api_key  # already a secret: stays encrypted in state
        return outputs


def build_deployment(settings: Settings) -> Deployment:
    config = settings.config
    known_hosts = _expand(config.ssh.known_hosts_file)
    if known_hosts is not None and not known_hosts.is_file():
        raise pulumi.RunError(f"ssh.knownHostsFile: {known_hosts} does not exist")
    try:
        plan = plan_deployment(config, settings.deployment_id, known_hosts)
    except ValueError as error:
        raise pulumi.RunError(f"invalid spark-vllm configuration:\n{error}") from None
    _warn_unpinned(plan)
    if config.docker.max_restarts is not None:
        pulumi.log.warn(
            "docker.maxRestarts is ignored and can be removed: Ray containers restart after "
            "every crash and the server unless stopped, with Docker's backoff (README, Reboot)"
        )
    auth = _ssh_auth(config.ssh)
    derived_known_hosts = settings.local_dir / "known_hosts"
    write_known_hosts(
        derived_known_hosts,
        [e for n in plan.nodes for e in (n.ssh, n.jump) if e is not None],
    )
    control_dir = settings.local_dir / "cm"
    control_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    hosts = {
        node.name: Host(
            node.name,
            HostArgs(plan, node, auth, derived_known_hosts, control_dir),
        )
        for node in plan.nodes
    }
    head = hosts[plan.head.name]
    workers = [hosts[n.name] for n in plan.workers]
    trust = FabricTrust("fabric", FabricTrustArgs(plan, head, workers))
    image = ImageDistribution("image", ImageDistributionArgs(plan, head, workers, trust.access))
    weights = ModelWeights(
        "weights",
        ModelWeightsArgs(plan, head, workers, trust.access, image.present_on, settings.hf_token),
    )
    ray = RayCluster(
        "ray", RayClusterArgs(plan, head, workers, image.image_id, image.present_on, trust.access)
    )
    server = VllmServer(
        "vllm",
        VllmServerArgs(
            plan,
            head,
            image.image_id,
            ray,
            list(weights.present_on.values()),
            trust.access,
            settings.api_key,
        ),
    )
    return Deployment(plan, hosts, image, weights, ray, server, settings.api_key)


def _expand(path: str | None) -> Path | None:
    return Path(path).expanduser() if path is not None else None


def _ssh_auth(ssh: SshConfig) -> SshAuth:
    if ssh.use_agent:
        socket = os.environ.get("SSH_AUTH_SOCK")
        if not socket:
            raise pulumi.RunError(
                "ssh.useAgent: true, but SSH_AUTH_SOCK is not set: start ssh-agent and ssh-add "
                "your key, or set ssh.privateKeyPath"
            )
        return SshAuth(None, None, socket, ssh.dial_error_limit, ssh.per_dial_timeout_seconds)
    key_path = _expand(ssh.private_key_path)
    assert key_path is not None  # SshConfig guarantees one auth method
    try:
        key = key_path.read_text()
    except OSError as error:
        raise pulumi.RunError(
            f"ssh.privateKeyPath: cannot read {key_path} ({error.strerror})"
        ) from None
    return SshAuth(
        pulumi.Output.secret(key),
        str(key_path),
        None,
        ssh.dial_error_limit,
        ssh.per_dial_timeout_seconds,
    )


def _warn_unpinned(plan: DeploymentPlan) -> None:
    unpinned = unpinned_endpoints(plan)
    if unpinned:
        pulumi.log.warn(
            "SSH host keys are NOT pinned for: "
            + ", ".join(unpinned)
            + ". Anyone on the path could impersonate these hosts. Set hosts[].hostKey / "
            "bastion.hostKey, or ssh.knownHostsFile to a file that lists them."
        )
