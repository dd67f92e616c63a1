"""The cluster: every host as a node (its SSH route, its fabric, its state directory), the head,
the workers, and the fleet's servers in their slots. Derived once from the typed config.

Components never re-derive an IP, an interface name or a route: they read a `NodePlan` or the
`ClusterPlan`. What one server of the fleet needs (its nodes, ports, arguments) is its
`ServerPlan` (stacks/plan/server_plan.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from stacks.config import BASTION, HostConfig, StackConfig, check_ports, default_state_dir
from stacks.fleet import ServerSlot, assign_slots
from stacks.known_hosts import find_host_key, is_rsa

# In each node's state leaf: the deployment that made it. Every delete checks it first.
OWNER_FILE = ".spark-vllm-owner"
# The stack instance that claimed the leaf (stacks/plan/instance.py): two stacks of one name never
# share it.
INSTANCE_FILE = ".spark-vllm-instance"

# The containers of the cluster itself (a server's are its ServerPlan's: `vllm`, slot-named).
ClusterContainer = Literal[
    "ray-head", "ray-worker", "front", "firewall", "memory-guard", "docker-filter"
]


@dataclass(frozen=True)
class SshEndpoint:
    """One SSH server as this machine dials it."""

    label: str  # the host's name, or "bastion"
    address: str
    port: int
    user: str
    host_key: str | None

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.address}"


@dataclass(frozen=True)
class NodePlan:
    name: str
    role: Literal["head", "worker"]
    ssh: SshEndpoint
    jump: SshEndpoint | None
    fabric_interface: str
    fabric_ip: str
    rdma_hcas: tuple[str, ...]
    gpus: int
    state_dir: str
    # vllm.hostNccl: the host's libnccl.so.2 as its loader cache lists it (its facts,
    # stacks/plan/nccl.py with_host_nccl); empty: the containers load the image's NCCL.
    host_nccl: str = ""

    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def owner_file(self) -> str:
        return f"{self.state_dir}/{OWNER_FILE}"

    @property
    def instance_file(self) -> str:
        return f"{self.state_dir}/{INSTANCE_FILE}"

    @property
    def bin_dir(self) -> str:
        return f"{self.state_dir}/bin"

    @property
    def ray_dir(self) -> str:
        return f"{self.state_dir}/ray"

    @property
    def compile_cache_dir(self) -> str:
        return f"{self.state_dir}/compile-cache"

    @property
    def fabric_destination(self) -> str:
        """How the head reaches this node over the fabric (image and weights transfer)."""
        return f"ssh://{self.ssh.user}@{self.fabric_ip}:{self.ssh.port}"


@dataclass(frozen=True)
class ClusterPlan:
    """Every host of the deployment, and the fleet's servers in their slots."""

    config: StackConfig
    deployment_id: str  # "<project>/<stack>", stamped on containers as a label
    nodes: tuple[NodePlan, ...]  # every host, in hosts order
    servers: tuple[ServerSlot, ...]  # one per fleet entry, in the order written
    recorded: bool = False  # the head holds a record of the slots (stacks/fleet.py)

    @property
    def head(self) -> NodePlan:
        return next(n for n in self.nodes if n.is_head)

    @property
    def workers(self) -> tuple[NodePlan, ...]:
        return tuple(n for n in self.nodes if not n.is_head)

    @property
    def expects_rdma(self) -> bool:
        """Some host names HCAs: NCCL should run over RoCE between the nodes."""
        return any(n.rdma_hcas for n in self.nodes)

    @property
    def runs_ray(self) -> bool:
        """Some server of the fleet is Ray's driver: the cluster runs Ray."""
        return any(slot.model.settings.executor == "ray" for slot in self.servers)

    @property
    def guards_memory(self) -> bool:
        """memoryGuard.enabled, where `auto` follows preflight.unifiedMemory: a host whose GPU
        takes the system's memory is the one a start-up can wedge."""
        enabled = self.config.memory_guard.enabled
        return self.config.preflight.unified_memory if enabled == "auto" else enabled

    @property
    def ray_address(self) -> str:
        return f"{self.head.fabric_ip}:{self.config.ray.port}"

    def container_name(self, purpose: ClusterContainer) -> str:
        return f"{self.config.docker.container_prefix}-{purpose}"

    @property
    def labels(self) -> dict[str, str]:
        return {"spark-vllm.deployment": self.deployment_id}

    @property
    def listen_address(self) -> str:
        """Where the front publishes `vllm.port` on the head (vllm.listen)."""
        return {"all": "0.0.0.0", "fabric": self.head.fabric_ip, "loopback": "127.0.0.1"}[
            self.config.vllm.listen
        ]

    @property
    def probe_address(self) -> str:
        """Where the readiness probe, run inside the server's container (host network), asks the
        front: the whole route a client takes, the key included."""
        return "127.0.0.1" if self.listen_address == "0.0.0.0" else self.listen_address

    @property
    def endpoint_host(self) -> str:
        """The address clients reach the front at: the head's SSH address, its fabric IP, or its
        loopback (`vllm.listen: loopback`: through `ssh -L <port>:127.0.0.1:<port>` to the
        head). A self-signed front certificate names it (front.tls.selfSigned)."""
        return {"0.0.0.0": self.head.ssh.address}.get(self.listen_address, self.listen_address)

    @property
    def endpoint_url(self) -> str:
        """The API as clients reach it (endpoint_host), over HTTPS with front.tls."""
        scheme = "https" if self.config.front.tls.enabled else "http"
        return f"{scheme}://{self.endpoint_host}:{self.config.vllm.port}/v1"

    @property
    def api_key_dir(self) -> str:
        """Mounted, not the file: a file written again (a new inode) or written only after the
        server's start is seen through a directory, and a missing file does not stop Docker
        from starting the container (the launcher refuses to serve instead)."""
        return f"{self.head.state_dir}/secrets"

    @property
    def api_key_file(self) -> str:
        return f"{self.api_key_dir}/api-key"

    @property
    def front_secrets_dir(self) -> str:
        """The front's own secrets on the head (the key's pattern file, the named keys' maps,
        the table handover's key pair): mounted into the front's container alone, never beside
        the key a server reads (stacks/plan/front.py)."""
        return f"{self.head.state_dir}/front-secrets"

    def hosts_of(self, slot: ServerSlot) -> tuple[NodePlan, ...]:
        """The nodes `slot`'s server runs on, in hosts order."""
        hosts = set(slot.model.hosts)
        return tuple(n for n in self.nodes if n.name in hosts)

    def slots_on(self, node: NodePlan) -> list[ServerSlot]:
        """The servers that run on `node` (a rank of theirs, or the server itself)."""
        return [slot for slot in self.servers if node.name in slot.model.hosts]

    def ray_container_of(self, node: NodePlan) -> str:
        return self.container_name("ray-head" if node.is_head else "ray-worker")


def node_lines(nodes: Iterable[NodePlan]) -> str:
    """`node|dest|bin`, one node a line (a state dir may hold a space; the config refuses `|`
    and line breaks in paths): how head-side scripts reach each node's scripts (the head: `-`)."""
    return "\n".join(
        f"{n.name}|{'-' if n.is_head else n.fabric_destination}|{n.bin_dir}" for n in nodes
    )


def plan_cluster(config: StackConfig, deployment_id: str, known_hosts: Path | None) -> ClusterPlan:
    """Resolve routes, pinned keys and roles for every host (the config is already consistent)."""
    head = config.head
    endpoints = {
        h.name: _endpoint(h.name, h.address, h.port, h.user, h.host_key, known_hosts)
        for h in config.hosts
    }
    bastion = None
    if config.bastion is not None:
        b = config.bastion
        bastion = _endpoint(BASTION, b.address, b.port, b.user, b.host_key, known_hosts)
    nodes = tuple(
        NodePlan(
            name=host.name,
            role="head" if host is head else "worker",
            ssh=endpoints[host.name],
            jump=_jump_for(host, endpoints, bastion),
            fabric_interface=host.fabric_interface,
            fabric_ip=str(host.fabric_ip),
            rdma_hcas=tuple(host.rdma_hcas),
            gpus=host.gpus,
            state_dir=state_leaf(host, deployment_id),
        )
        for host in config.hosts
    )
    servers = assign_slots(config.fleet, {})
    return ClusterPlan(config=config, deployment_id=deployment_id, nodes=nodes, servers=servers)


def placed(plan: ClusterPlan, recorded: Mapping[str, int]) -> ClusterPlan:
    """`plan` with each server in the slot the head recorded for it (stacks/fleet.py). A slot
    beyond the fleet's size (left by removals) has its ports checked as the config's were."""
    servers = assign_slots(plan.config.fleet, recorded)
    check_ports(plan.config, max(s.index for s in servers) + 1)
    return replace(plan, servers=servers, recorded=bool(recorded))


def keeps_slot_record(plan: ClusterPlan) -> bool:
    """The head records the slots once a stack had several models (or a model moved off slot
    0), and from then on with every change: a stale record would give a switched model a slot
    still in use. A stack that only ever served one model writes none (and plans nothing for it)."""
    return len(plan.servers) > 1 or plan.recorded or any(s.index for s in plan.servers)


def rsa_pinned_endpoints(plan: ClusterPlan) -> list[SshEndpoint]:
    """The SSH servers this machine dials whose pin is an RSA key (stacks/known_hosts.py says
    why no step could reach them), each once."""
    seen = {e.label: e for n in plan.nodes for e in (n.ssh, n.jump) if e is not None}
    return [seen[label] for label in sorted(seen) if is_rsa(seen[label].host_key)]


def unpinned_endpoints(plan: ClusterPlan) -> list[str]:
    """Labels of every SSH server this machine would talk to without checking its key."""
    seen: dict[str, SshEndpoint] = {}
    for node in plan.nodes:
        for endpoint in (node.ssh, node.jump):
            if endpoint is not None:
                seen[endpoint.label] = endpoint
    return sorted(label for label, e in seen.items() if e.host_key is None)


def _endpoint(
    label: str, address: str, port: int, user: str, pinned: str | None, known_hosts: Path | None
) -> SshEndpoint:
    key = pinned
    if key is None and known_hosts is not None:
        key = find_host_key(known_hosts, address, port)
    return SshEndpoint(label=label, address=address, port=port, user=user, host_key=key)


def _jump_for(
    host: HostConfig, endpoints: dict[str, SshEndpoint], bastion: SshEndpoint | None
) -> SshEndpoint | None:
    if host.via is None:
        return None
    if host.via == BASTION:
        return bastion
    return endpoints[host.via]


def state_leaf(host: HostConfig, deployment_id: str) -> str:
    """This deployment's own directory on `host`: a leaf under `stateDir` (by default
    `~/.spark-vllm`) named after the project and stack, so two stacks on one host keep apart,
    and every delete stays inside a directory the program made and marked (OWNER_FILE)."""
    base = host.state_dir if host.state_dir is not None else default_state_dir(host.user)
    return f"{base.rstrip('/')}/{deployment_id.replace('/', '.')}"
