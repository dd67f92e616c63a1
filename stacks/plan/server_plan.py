"""One server of the fleet (one slot of the cluster): the model it serves, its nodes and ranks,
its ports and rendezvous, its container names and key file, and where it runs.

A `ServerPlan` is made from the `ClusterPlan` (`serving`, `per_server`); what it says of the
cluster (the head, the config, the front's address) is its cluster's.
"""

from __future__ import annotations

from dataclasses import dataclass

from stacks.config import MP_PORT_SPAN, RAY_CLIENT_SERVER_PORT, StackConfig
from stacks.fleet import ServedModel, ServerSlot
from stacks.plan.cluster import ClusterPlan, NodePlan, node_lines
from stacks.plan.image import ImageStream, image_streams
from stacks.plan.later import PINNED_IMAGE, Later


@dataclass(frozen=True)
class ServerPlan:
    cluster: ClusterPlan
    slot: ServerSlot
    nodes: tuple[NodePlan, ...]  # the server's hosts, in hosts order

    @property
    def config(self) -> StackConfig:
        return self.cluster.config

    @property
    def head(self) -> NodePlan:
        """The cluster's head: where the front, the fetch and the checks run."""
        return self.cluster.head

    @property
    def served(self) -> ServedModel:
        return self.slot.model

    @property
    def uses_ray(self) -> bool:
        """vllm.executor ray: a Ray cluster, the server its driver. Else vLLM's mp mode."""
        return self.served.settings.executor == "ray"

    @property
    def workers(self) -> tuple[NodePlan, ...]:
        """The server's hosts other than the head."""
        return tuple(n for n in self.nodes if not n.is_head)

    @property
    def server_node(self) -> NodePlan:
        """Where the server runs (its API, rank 0): the head when among its hosts, else the
        first of them."""
        return next((n for n in self.nodes if n.is_head), self.nodes[0])

    @property
    def ranks(self) -> tuple[NodePlan, ...]:
        """The server's nodes in node-rank order (mp): its own node, then the others."""
        server = self.server_node
        return (server, *(n for n in self.nodes if n.name != server.name))

    def runs_server(self, node: NodePlan) -> bool:
        return node.name == self.server_node.name

    def node_rank(self, node: NodePlan) -> int:
        """mp: the server's node is node rank 0, its other hosts follow in hosts order."""
        return [n.name for n in self.ranks].index(node.name)

    @property
    def expects_rdma(self) -> bool:
        """Some host of the server names HCAs: NCCL should run over RoCE between its nodes."""
        return any(n.rdma_hcas for n in self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def later(self, value: Later) -> Later:
        """`value` as this server consumes it: its own slot's (its fetch, its check)."""
        return value.of_slot(self.slot.index)

    @property
    def image_stream(self) -> ImageStream:
        """The image the server runs: image.ref's, or its entry's own."""
        ref = self.served.image.ref
        return next(s for s in image_streams(self.cluster) if s.image.ref == ref)

    @property
    def pinned_image(self) -> Later:
        """The server's image by its pinned name on every node (a later value)."""
        return self.image_stream.later(PINNED_IMAGE)

    @property
    def server_port(self) -> int:
        """vLLM's own port (loopback, behind the front): vllm.serverPort for slot 0."""
        return self.slot.server_port(self.config.vllm.server_port)

    @property
    def master_port(self) -> int:
        """mp: where the server's ranks meet; vLLM's own ports follow it (MP_PORT_SPAN)."""
        return self.slot.master_port(self.config.vllm.master_port)

    @property
    def rendezvous(self) -> str:
        """mp: where every node's ranks meet (vLLM's --master-addr and --master-port)."""
        return f"{self.server_node.fabric_ip}:{self.master_port}"

    @property
    def vllm_container(self) -> str:
        """On every node of the server (a headless rank's too: one name to look for on any
        node). Slot k's is `<prefix>-vllm-s<k>` (ServerSlot)."""
        return self.slot.named(f"{self.config.docker.container_prefix}-vllm")

    @property
    def server_address(self) -> str:
        """vLLM's own `--host`: loopback on the head; a server on a worker, its fabric IP (the
        front reaches it there; the firewall admits the port on loopback and the fabric only).
        Its key check covers /v1 only; the front, on `vllm.port`, admits nothing without the
        key (stacks/plan/front.py)."""
        node = self.server_node
        return "127.0.0.1" if node.is_head else node.fabric_ip

    @property
    def server_key_dir(self) -> str:
        """The API key's directory where the server runs (the head's: the cluster's)."""
        return f"{self.server_node.state_dir}/secrets"


def serving(cluster: ClusterPlan, slot: ServerSlot) -> ServerPlan:
    return ServerPlan(cluster, slot, cluster.hosts_of(slot))


def per_server(cluster: ClusterPlan) -> tuple[ServerPlan, ...]:
    """Each server's plan, in the fleet's order."""
    return tuple(serving(cluster, slot) for slot in cluster.servers)


def servers_on(cluster: ClusterPlan, node: NodePlan) -> list[ServerPlan]:
    """The plans of the servers that run on `node` (a rank of theirs, or the server itself)."""
    return [serving(cluster, slot) for slot in cluster.slots_on(node)]


def serving_container_names(plan: ServerPlan, node: NodePlan) -> list[str]:
    """This deployment's Ray and vLLM containers on `node`, with either executor (a switch of
    executors finds the other one's still running: its delete comes last): what a restart of
    the server gives back memory from. Among several models Ray's containers are the Ray
    model's (its ranks run in them), and only its."""
    cluster = plan.cluster
    others_slot = plan.slot.index > 0 or cluster.runs_ray  # Ray's containers are another's
    if len(cluster.servers) > 1 and not plan.uses_ray and others_slot:
        return [plan.vllm_container]
    return [cluster.ray_container_of(node), plan.vllm_container]


def own_container_names(cluster: ClusterPlan, node: NodePlan) -> list[str]:
    """Every container of this deployment on `node`: another deployment's container of the same
    name is refused by preflight, naming that deployment."""
    servers = [server.vllm_container for server in servers_on(cluster, node)]
    names = [cluster.ray_container_of(node), *servers, cluster.container_name("firewall")]
    return [*names, cluster.container_name("front")] if node.is_head else names


def node_check_specs(plan: ServerPlan) -> str:
    """Where the wait scripts re-check image, weights and memory: every node of the server."""
    return node_lines(plan.nodes)


def log_specs(plan: ServerPlan, include_vllm: bool = False) -> str:
    """`node|dest|container` words for the diagnostics in the wait scripts (head is local: `-`)."""
    if not plan.uses_ray:
        return " ".join(
            f"{n.name}|{'-' if n.is_head else n.fabric_destination}|{plan.vllm_container}"
            for n in plan.nodes
        )
    cluster = plan.cluster
    specs = [f"{plan.head.name}|-|{cluster.container_name('ray-head')}"]
    specs += [
        f"{w.name}|{w.fabric_destination}|{cluster.container_name('ray-worker')}"
        for w in plan.workers
    ]
    if include_vllm:
        specs.append(f"{plan.head.name}|-|{plan.vllm_container}")
    return " ".join(specs)


def cluster_listen_ports(
    plan: ServerPlan, node: NodePlan, uses_ray: bool | None = None
) -> list[str]:
    """Ports (and ranges) the nodes listen on for each other, on every interface, on `node`:
    vLLM's own (VLLM_PORT on: message queues, the Ray driver's TCPStore), and Ray's, or with
    executor mp the rendezvous (head). `uses_ray`: for that executor, not the configured one."""
    first = plan.master_port + 1
    vllm_ports = f"{first}:{first + MP_PORT_SPAN - 1}"
    if not (plan.uses_ray if uses_ray is None else uses_ray):
        return [str(plan.master_port), vllm_ports] if plan.runs_server(node) else [vllm_ports]
    ray = plan.config.ray
    ports = list(ray.node_port_flags.values())
    if node.is_head:
        ports = [ray.port, RAY_CLIENT_SERVER_PORT, *ports]
    return [str(p) for p in ports] + [f"{ray.min_worker_port}:{ray.max_worker_port}", vllm_ports]
