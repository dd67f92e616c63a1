"""The composition of one deployment: hosts -> fabric trust -> image and weights -> memory ->
Ray (executor ray) -> vLLM."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi

from components.bundle import entry_scripts, scripts_bundle
from components.compile_cache import CompileCache
from components.fabric_trust import FabricTrust
from components.facts import HostFacts, gather_facts, refuse_unsafe
from components.firewall import Firewall
from components.front import Front
from components.graph import Walk
from components.host import Host, HostArgs
from components.image import ImageDistribution
from components.instance import StackInstance
from components.memory import ServerMemory
from components.memory_guard import MemoryGuard
from components.monitoring import Monitoring
from components.ray_cluster import RayCluster
from components.vllm_server import VllmServer
from components.weights import ModelWeights
from stacks.config import BASTION, ConfigError
from stacks.known_hosts import known_hosts_name, write_known_hosts
from stacks.plan import hardware, names, server
from stacks.plan.cluster import (
    ClusterPlan,
    placed,
    plan_cluster,
    rsa_pinned_endpoints,
    unpinned_endpoints,
)
from stacks.plan.cold_start import cold_start, cold_start_steps, cold_start_table
from stacks.plan.front import certificate_sha256, first_certificate
from stacks.plan.graph import DeploymentGraph, GraphFacts, plan_graph
from stacks.plan.nccl import host_nccl_problems, nccl_output, with_host_nccl
from stacks.plan.server_plan import ServerPlan, per_server
from stacks.plan.steps import Stdin
from stacks.settings import Settings


@dataclass(frozen=True)
class Deployment:
    plan: ClusterPlan
    hosts: dict[str, Host]
    trust: FabricTrust
    image: ImageDistribution
    memories: tuple[ServerMemory, ...]  # per server, in the fleet's order
    front: Front
    servers: tuple[VllmServer, ...]  # in the fleet's order
    api_key: pulumi.Output[str]
    cold_starts: tuple[pulumi.Output[dict[str, Any]], ...] = ()  # per server, in fleet order
    monitoring: Monitoring | None = None  # monitoring.enabled
    front_certificate: str | None = None  # front.tls's, from the user's file (not secret)
    instance: pulumi.Output[str] | None = None  # the stack instance's token (its claims)

    def outputs(self) -> dict[str, object]:
        plan, first, memory = self.plan, self.servers[0], self.memories[0]
        first_model = plan.servers[0].model
        every_ready = pulumi.Output.all(*(s.readiness.stdout for s in self.servers))
        outputs: dict[str, object] = {
            # Resolves only once every server answered a real completion.
            "endpointUrl": every_ready.apply(lambda _: plan.endpoint_url),
            "modelId": first_model.served_name,
            "head": {"name": plan.head.name, "address": plan.head.ssh.address},
            "nodes": [
                {"name": n.name, "role": n.role, "fabricIp": n.fabric_ip, "gpus": n.gpus}
                for n in plan.nodes
            ],
            "imageId": self.image.image_id,
            # Per node, the images it keeps (newest first: the serving one, then up to
            # image.keepPrevious previous ones): setting image.ref back to one copies nothing.
            "images": self.image.held,
            # The serving image as the head pulled it: pin `image.ref` to it (`...@sha256:...`).
            "imageDigest": self.image.repo_digest,
            # The front's image as pulled: pin `front.image` to it (`haproxy@sha256:...`).
            "frontImageDigest": self.front.image_digest,
            "vllmVersion": self.image.facts.apply(lambda facts: facts.get("vllm", "")),
            "rayVersion": self.image.facts.apply(lambda facts: facts.get("ray", "")),
            # The NCCL the head's server loads (release, path, why that one) and the host's own.
            "nccl": self.image.facts.apply(nccl_output),
            "executor": first_model.settings.executor,
            "readiness": first.readiness.stdout.apply(lambda out: out.strip()),
            # Per model: what it is, where it runs, its memory share and what it showed once
            # ready (time to first token, tokens/s). `modelId` stays for existing consumers.
            "models": pulumi.Output.all(
                *(
                    pulumi.Output.all(
                        s.readiness.stdout,
                        m.sizing,
                        s.benchmark.stdout if s.benchmark is not None else None,
                        c,
                    ).apply(functools.partial(_model_output, each))
                    for each, s, m, c in zip(
                        per_server(plan), self.servers, self.memories, self.cold_starts, strict=True
                    )
                )
            ),
            "fabricTransport": first.fabric_transport,
            # The link test's figures per worker, and the memory the server was sized for.
            "fabricLinks": {
                worker: link.stdout.apply(hardware.parse_fabric_link)
                for worker, link in self.trust.links.items()
            },
            "memory": memory.sizing,
        }
        if first.benchmark is not None:  # vllm.benchmark: tokens/s and TTFT per concurrency
            outputs["benchmark"] = first.benchmark.stdout.apply(server.parse_benchmark)
        if self.monitoring is not None:  # where Prometheus and Grafana are, targets up
            outputs["monitoring"] = self.monitoring.summary
            if self.monitoring.grafana_password is not None:  # `admin`'s, its own secret
                outputs["grafanaAdminPassword"] = self.monitoring.grafana_password
        if plan.config.front.tls.enabled:  # for clients to trust (or pin) the front's
            certificate = self._front_certificate()
            outputs["frontCertificate"] = certificate
            outputs["frontCertificateSha256"] = certificate.apply(certificate_sha256)
        if self.instance is not None:  # which stack holds a host: its refusals name this
            outputs["instance"] = self.instance
        outputs["apiKey"] = self.api_key  # already a secret: stays encrypted in state
        return outputs

    def _front_certificate(self) -> pulumi.Output[str]:
        """The front's certificate: the user's file, known at once; or the one the head made
        (front.tls.selfSigned), as its step printed it."""
        if self.front_certificate is not None:
            return pulumi.Output.from_input(first_certificate(self.front_certificate))
        assert self.front.tls_stdout is not None, "front.tls plans the certificate's step"
        return self.front.tls_stdout.apply(first_certificate)


def build_deployment(settings: Settings) -> Deployment:
    config = settings.config
    plan = plan_cluster(config, settings.deployment_id, settings.known_hosts)
    _refuse_unpinned(plan)
    _refuse_rsa_pins(plan)
    if not plan.runs_ray and config.ray.customized:
        pulumi.log.warn(
            "ray: "
            + ", ".join(config.ray.customized)
            + " set, but vllm.executor is mp: no Ray runs, these settings are not used "
            "(vllm.executor: ray keeps a Ray cluster)"
        )
    if not config.fabric.firewall:
        pulumi.log.warn(
            "fabric.firewall is false: Ray, vLLM's own ports and torch's rendezvous listen on "
            "every interface of every host with nothing in front of them, and Ray runs code for "
            "whoever reaches it. Turn it back on unless every host sits on a network only you "
            "can reach (docs/security.md)."
        )
    if config.fabric.shared_with_management:
        pulumi.log.warn(
            "fabric.sharedWithManagement is true: the firewall admits everything that arrives on "
            "each host's fabric interface, and SSH reaches the hosts over it, so whoever else is "
            "on that network reaches Ray (which runs code for anyone) and vLLM's own ports. Keep "
            "it only for a fabric no one but these hosts is on (docs/security.md)."
        )
    if config.docker.max_restarts is not None:
        pulumi.log.warn(
            "docker.maxRestarts is ignored and can be removed: Ray containers restart after "
            "every crash and the server unless stopped, with Docker's backoff "
            "(docs/operations.md, Reboot)"
        )
    derived_known_hosts = settings.local_dir / "known_hosts"
    write_known_hosts(
        derived_known_hosts,
        [e for n in plan.nodes for e in (n.ssh, n.jump) if e is not None],
    )
    control_dir = settings.local_dir / "cm"
    control_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    # What the plan needs of the hosts and of this machine, read before any resource.
    guard = plan.container_name("memory-guard") if plan.guards_memory else ""
    cache_dir = plan.config.model.cache_dir
    facts = {
        node.name: gather_facts(
            node, settings.ssh_auth, derived_known_hosts, control_dir, cache_dir, guard
        )
        for node in plan.nodes
    }
    refuse_unsafe(facts.values())  # before anything is written to a state or cache directory
    _warn_guard_stops(facts)
    # Each model in the slot the head recorded for it: its resources' names and ports stay.
    try:
        plan = placed(plan, facts[plan.head.name].slots)
    except ConfigError as error:  # a slot left by removals whose ports collide
        raise pulumi.RunError(f"invalid spark-vllm configuration:\n{error}") from None
    plan = _with_host_nccl(plan, facts)
    bundle = scripts_bundle()
    mounts_tokens = {name: facts[name].token(names.mounts_of(name)) for name in facts}
    graph = plan_graph(plan, GraphFacts(bundle.digest, entry_scripts(), mounts_tokens))
    stdin: dict[Stdin, pulumi.Input[str]] = {
        "scripts-bundle": bundle.archive_b64,
        "hf-token": settings.hf_token if settings.hf_token is not None else "",
        "api-key": settings.api_key,
        "user-keys": settings.user_keys,
        "front-tls": settings.front_tls if settings.front_tls is not None else "",
    }
    walk = Walk(plan, graph, stdin)
    # Before every host step: each one's claim names the instance (stacks/plan/instance.py).
    instance = StackInstance()
    walk.built[names.INSTANCE_TOKEN] = instance.token_command
    host_args = functools.partial(
        HostArgs,
        auth=settings.ssh_auth,
        known_hosts_file=derived_known_hosts,
        control_dir=control_dir,
        walk=walk,
    )
    nodes = {node.name: node for node in plan.nodes}
    deployment = _register(graph, walk, lambda name: host_args(nodes[name], facts=facts[name]))
    _warn_hardware(deployment.hosts)
    unbuilt = [entry.name for entry in graph if entry.name not in walk.built]
    assert not unbuilt, f"planned but never registered: {unbuilt}"
    cold_starts = tuple(_cold_start(each, graph, walk) for each in per_server(plan))
    return Deployment(
        plan=plan,
        api_key=settings.api_key,
        cold_starts=cold_starts,
        front_certificate=settings.front_certificate,
        instance=instance.token,
        **deployment.parts(),
    )


def _cold_start(plan: ServerPlan, graph: DeploymentGraph, walk: Walk) -> pulumi.Output[Any]:
    """A server's cold-start figures (stacks/plan/cold_start.py), printed once `up` knows them."""
    steps = cold_start_steps(plan, graph.by_name)
    stdout = {name: walk.step(name).stdout for name in steps.every()}

    def figures(out: dict[str, str]) -> dict[str, Any]:
        found = cold_start(steps, out)
        pulumi.log.info(cold_start_table(plan.served.served_name, found))
        return found

    return pulumi.Output.all(**stdout).apply(figures)


@dataclass
class _Registered:
    """The components as the graph lists them, registered in that order."""

    hosts: dict[str, Host]
    images: list[ImageDistribution]
    memories: list[ServerMemory]
    servers: list[VllmServer]
    trust: FabricTrust | None = None
    front: Front | None = None
    monitoring: Monitoring | None = None

    def parts(self) -> dict[str, Any]:
        assert self.trust is not None and self.front is not None, "the graph lists both"
        return {
            "hosts": self.hosts,
            "trust": self.trust,
            "image": self.images[0],
            "memories": tuple(self.memories),
            "front": self.front,
            "servers": tuple(self.servers),
            "monitoring": self.monitoring,
        }


def _register(
    graph: DeploymentGraph, walk: Walk, host_args: Callable[[str], HostArgs]
) -> _Registered:
    """Each component of the graph, in its order (stacks/plan/graph.py `_components`)."""
    done = _Registered(hosts={}, images=[], memories=[], servers=[])
    for component in graph.components:
        name = component.name
        match component.kind:
            case "host":
                done.hosts[name] = Host(name, host_args(name))
            case "fabric":
                done.trust = FabricTrust(walk)
            case "image":
                done.images.append(ImageDistribution(walk, name))
            case "weights":
                ModelWeights(walk, name)
            case "memory":
                done.memories.append(ServerMemory(walk, name))
            case "firewall":
                Firewall(walk)
            case "memory-guard":
                MemoryGuard(walk)
            case "front":
                done.front = Front(walk)
            case "compile-cache":
                CompileCache(walk)
            case "ray":
                RayCluster(walk)
            case "vllm":
                done.servers.append(VllmServer(walk, name))
            case "monitoring":
                done.monitoring = Monitoring(walk)
    return done


def _model_output(plan: ServerPlan, done: list[Any]) -> dict[str, Any]:
    """One entry of the `models` output, from its server's readiness, memory check, (with
    vllm.benchmark) its benchmark, and its cold-start figures."""
    output = server.model_output(plan, done[0], done[1])
    if done[2] is not None:
        output["benchmark"] = server.parse_benchmark(done[2])
    output["coldStart"] = done[3]
    return output


def _warn_hardware(hosts: dict[str, Host]) -> None:
    """An allowed known-bad release, and kernels or drivers that differ between the nodes, as
    warnings in the `pulumi up` output (preflight refuses a known-bad one by default)."""
    facts = pulumi.Output.all(
        *[host.preflight.stdout.apply(hardware.parse_preflight) for host in hosts.values()]
    )

    def warn(per_node: list[dict[str, object]]) -> None:
        for warning in hardware.hardware_warnings(dict(zip(hosts, per_node, strict=True))):
            pulumi.log.warn(warning)

    facts.apply(warn)


def _with_host_nccl(plan: ClusterPlan, facts: dict[str, HostFacts]) -> ClusterPlan:
    """vllm.hostNccl: each node's own NCCL from its facts, or every host without one (or with a
    known-bad release) refused before anything is declared."""
    found = {name: node_facts.nccl for name, node_facts in facts.items()}
    problems = host_nccl_problems(plan, found)
    if problems:
        raise pulumi.RunError("invalid spark-vllm configuration:\n" + "\n".join(problems))
    return with_host_nccl(plan, found)


def _warn_guard_stops(facts: dict[str, HostFacts]) -> None:
    """A server the memory guard stopped, and stopped still, in the `up` (and `preview`) output:
    the `up --refresh` that reads it stopped starts it again (pulumi-docker's must_run), into
    the same wall unless its memory was lowered first."""
    for node_facts in facts.values():
        for line in node_facts.guard_stops:
            pulumi.log.warn(
                f"{line.removeprefix('spark-vllm: ')}; it is stopped still. Lower "
                "vllm.gpuMemoryUtilization or vllm.kvCache (or free what else holds the "
                "memory) before an `up --refresh` starts it again (docs/troubleshooting.md, "
                "The memory guard stopped a server)"
            )


def _refuse_rsa_pins(plan: ClusterPlan) -> None:
    """An RSA pin would fail every remote step: pulumi-command offers the server only
    `ssh-rsa` (SHA-1) for it, which OpenSSH 8.8 and later refuse. One line per host, keyed
    where the pin came from, with the command that fetches a key the provider can use."""
    rsa = rsa_pinned_endpoints(plan)
    if not rsa:
        return
    index = {host.name: i for i, host in enumerate(plan.config.hosts)}
    explicit = {h.name: h.host_key for h in plan.config.hosts}
    if plan.config.bastion is not None:
        explicit[BASTION] = plan.config.bastion.host_key
    lines = []
    for endpoint in rsa:
        where = f"hosts[{index[endpoint.label]}]" if endpoint.label in index else endpoint.label
        scan = f"ssh-keyscan -t ed25519,ecdsa -p {endpoint.port} {endpoint.address}"
        why = (
            "pulumi-command offers the server only ssh-rsa (SHA-1) as host-key algorithm for an "
            "RSA pin, which OpenSSH 8.8 and later refuse ('no common algorithm for host key'), "
            "so every step would fail"
        )
        if explicit.get(endpoint.label):
            lines.append(
                f"{where}.hostKey: {endpoint.label}'s pinned key is RSA (ssh-rsa): {why}. Pin "
                f"its ed25519 or ECDSA key instead (`{scan}`)"
            )
        else:
            known = plan.config.ssh.known_hosts_file
            lines.append(
                f"ssh.knownHostsFile: {known} lists only an RSA key (ssh-rsa) for "
                f"{endpoint.label} ({known_hosts_name(endpoint.address, endpoint.port)}): {why}. "
                f"Add its ed25519 or ECDSA key: `{scan} >> {known}` (or set {where}.hostKey)"
            )
    raise pulumi.RunError("invalid spark-vllm configuration:\n" + "\n".join(lines))


def _refuse_unpinned(plan: ClusterPlan) -> None:
    """Every SSH server must have a pinned key (the HF token, the API key and root-level commands
    go to it), unless ssh.allowUnpinned accepts whatever key they present, loudly."""
    unpinned = unpinned_endpoints(plan)
    if not unpinned:
        return
    ssh = plan.config.ssh
    if ssh.allow_unpinned:
        pulumi.log.warn(
            "SSH host keys are NOT pinned for: "
            + ", ".join(unpinned)
            + " (ssh.allowUnpinned: true). Anyone on the path could impersonate these hosts. "
            "Set hosts[].hostKey / bastion.hostKey, or ssh.knownHostsFile to a file that lists "
            "them."
        )
        return
    index = {host.name: i for i, host in enumerate(plan.config.hosts)}
    keys = [
        f"hosts[{index[label]}].hostKey" if label in index else f"{label}.hostKey"
        for label in unpinned
    ]
    searched = (
        f", and not in ssh.knownHostsFile {ssh.known_hosts_file}" if ssh.known_hosts_file else ""
    )
    raise pulumi.RunError(
        "invalid spark-vllm configuration:\n"
        f"{', '.join(keys)}: the SSH host keys of {', '.join(unpinned)} are not pinned (no "
        f"hostKey{searched}), so anyone on the path could impersonate these hosts and receive the "
        "secrets and commands meant for them. Pin them: set hosts[].hostKey / bastion.hostKey "
        "(a line of the host's /etc/ssh/ssh_host_ed25519_key.pub), or ssh.knownHostsFile to a "
        "file that lists them; or set ssh.allowUnpinned: true to accept any key they present, "
        "with a warning on every run"
    )
