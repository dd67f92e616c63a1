"""Every per-node setting, derived once from the typed config.

Components never re-derive an IP, an interface name or an environment variable: they read a
`NodePlan` or the `DeploymentPlan`. This is the single place the field's pitfalls about wrong NICs,
Gloo on loopback and env not reaching a worker are handled (../shared/ANCHORS.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from stacks.config import (
    BASTION,
    MAX_VLLM_READY_SECONDS,
    MP_PORT_SPAN,
    RAY_CLIENT_SERVER_PORT,
    HostConfig,
    ImageConfig,
    StackConfig,
    check_ports,
    default_state_dir,
)
from stacks.fleet import ServedModel, ServerSlot, assign_slots
from stacks.known_hosts import find_host_key
from stacks.plan.later import GPU_MEMORY_UTILIZATION, KV_CACHE_BYTES, PINNED_IMAGE, Later

GIB = 1024**3

# Paths inside every container (the host side comes from the config).
CONTAINER_HF_HOME = "/root/.cache/huggingface"
CONTAINER_RAY_DIR = "/tmp/ray"
CONTAINER_API_KEY_DIR = "/run/spark-vllm"
CONTAINER_API_KEY_FILE = f"{CONTAINER_API_KEY_DIR}/api-key"
CONTAINER_SCRIPTS_DIR = "/spark-vllm/bin"  # the host's <stateDir>/bin, read-only: the probes
CONTAINER_COMPILE_CACHE = "/spark-vllm/cache"  # the host's <stateDir>/compile-cache
# In each node's state leaf: the deployment that made it. Every delete checks it first.
OWNER_FILE = ".spark-vllm-owner"


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

    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def owner_file(self) -> str:
        return f"{self.state_dir}/{OWNER_FILE}"

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
class DeploymentPlan:
    """The deployment on its nodes. Its server-scoped properties (`served`, `server_port`, the
    vLLM container's name...) describe one server of the fleet, the first unless `serving`
    chose another; a plan `serving` made also has only that server's hosts as its `nodes`."""

    config: StackConfig
    deployment_id: str  # "<project>/<stack>", stamped on containers as a label
    nodes: tuple[NodePlan, ...]  # every host, or with `serving` the server's own
    servers: tuple[ServerSlot, ...]  # one per fleet entry, in the order written
    position: int = 0  # which of `servers` the server-scoped properties describe
    cluster: tuple[NodePlan, ...] = ()  # every host (set by plan_deployment)
    recorded: bool = False  # the head holds a record of the slots (stacks/fleet.py)

    def serving(self, server: ServerSlot) -> DeploymentPlan:
        """The plan of `server` alone: its properties, and its hosts as `nodes` (`head` stays
        the cluster's: where the front, the fetch and the checks run)."""
        hosts = set(server.model.hosts)
        own = tuple(n for n in self.cluster if n.name in hosts)
        return replace(self, position=self.servers.index(server), nodes=own)

    @property
    def server(self) -> ServerSlot:
        return self.servers[self.position]

    @property
    def server_node(self) -> NodePlan:
        """Where the plan's server runs (its API, rank 0): the head when among its hosts, else
        the first of them."""
        return next((n for n in self.nodes if n.is_head), self.nodes[0])

    @property
    def ranks(self) -> tuple[NodePlan, ...]:
        """The server's nodes in node-rank order (mp): its own node, then the others."""
        server = self.server_node
        return (server, *(n for n in self.nodes if n.name != server.name))

    def runs_server(self, node: NodePlan) -> bool:
        return node.name == self.server_node.name

    @property
    def per_server(self) -> tuple[DeploymentPlan, ...]:
        """This plan once for each server, in the fleet's order."""
        return tuple(self.serving(server) for server in self.servers)

    @property
    def head(self) -> NodePlan:
        return next(n for n in self.cluster or self.nodes if n.is_head)

    @property
    def workers(self) -> tuple[NodePlan, ...]:
        return tuple(n for n in self.nodes if not n.is_head)

    @property
    def expects_rdma(self) -> bool:
        """Some host names HCAs: NCCL should run over RoCE between the nodes."""
        return any(n.rdma_hcas for n in self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def served(self) -> ServedModel:
        return self.server.model

    @property
    def uses_ray(self) -> bool:
        """vllm.executor ray: a Ray cluster, the server its driver. Else vLLM's mp mode."""
        return self.served.settings.executor == "ray"

    def later(self, value: Later) -> Later:
        """`value` as the plan's server consumes it: its own slot's (its fetch, its check)."""
        return value.of_slot(self.server.index)

    @property
    def image_streams(self) -> tuple[ImageStream, ...]:
        return image_streams(self)

    @property
    def image_stream(self) -> ImageStream:
        """The image the plan's server runs: image.ref's, or its entry's own."""
        ref = self.served.image.ref
        return next(s for s in self.image_streams if s.image.ref == ref)

    @property
    def pinned_image(self) -> Later:
        """The plan's server's image by its pinned name on every node (a later value)."""
        return self.image_stream.later(PINNED_IMAGE)

    @property
    def runs_ray(self) -> bool:
        """Some server of the fleet is Ray's driver: the cluster runs Ray."""
        return any(p.uses_ray for p in self.per_server)

    @property
    def server_port(self) -> int:
        """vLLM's own port (loopback, behind the front): vllm.serverPort for slot 0."""
        return self.server.server_port(self.config.vllm.server_port)

    @property
    def master_port(self) -> int:
        """mp: where the server's ranks meet; vLLM's own ports follow it (MP_PORT_SPAN)."""
        return self.server.master_port(self.config.vllm.master_port)

    @property
    def ray_address(self) -> str:
        return f"{self.head.fabric_ip}:{self.config.ray.port}"

    @property
    def rendezvous(self) -> str:
        """mp: where every node's ranks meet (vLLM's --master-addr and --master-port)."""
        return f"{self.server_node.fabric_ip}:{self.master_port}"

    def node_rank(self, node: NodePlan) -> int:
        """mp: the server's node is node rank 0, its other hosts follow in hosts order."""
        return [n.name for n in self.ranks].index(node.name)

    def container_name(
        self,
        purpose: Literal["ray-head", "ray-worker", "vllm", "vllm-headless", "front", "firewall"],
    ) -> str:
        """A headless node's server is `<prefix>-vllm` too: one name to look for on any node.
        Slot k's vLLM containers are `<prefix>-vllm-s<k>` (ServerSlot)."""
        name = f"{self.config.docker.container_prefix}-{purpose.removesuffix('-headless')}"
        return self.server.named(name) if purpose.startswith("vllm") else name

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
    def server_address(self) -> str:
        """vLLM's own `--host`: loopback on the head; a server on a worker, its fabric IP (the
        front reaches it there; the firewall admits the port on loopback and the fabric only).
        Its key check covers /v1 only; the front, on `vllm.port`, admits nothing without the
        key (stacks/plan/front.py)."""
        node = self.server_node
        return "127.0.0.1" if node.is_head else node.fabric_ip

    @property
    def server_key_dir(self) -> str:
        """The API key's directory where the server runs (the head's: `api_key_dir`)."""
        return f"{self.server_node.state_dir}/secrets"

    @property
    def endpoint_url(self) -> str:
        """The API as clients reach it: the head's SSH address, its fabric IP, or its loopback
        (`vllm.listen: loopback`: through `ssh -L <port>:127.0.0.1:<port>` to the head)."""
        host = {"0.0.0.0": self.head.ssh.address}.get(self.listen_address, self.listen_address)
        return f"http://{host}:{self.config.vllm.port}/v1"

    @property
    def api_key_dir(self) -> str:
        """Mounted, not the file: a file written again (a new inode) or written only after the
        server's start is seen through a directory, and a missing file does not stop Docker
        from starting the container (the launcher refuses to serve instead)."""
        return f"{self.head.state_dir}/secrets"

    @property
    def api_key_file(self) -> str:
        return f"{self.api_key_dir}/api-key"


def node_env(plan: DeploymentPlan, node: NodePlan) -> dict[str, str]:
    """The environment of every Ray/vLLM process on `node`: NICs, IPs and the offline HF cache.

    Not set, because nothing reads it: RAY_NODE_IP_ADDRESS (absent from Ray 2.60's wheel, Python
    and binaries alike; `ray start --node-ip-address` sets each node's IP).
    """
    env = dict(plan.served.settings.env)
    env.update(
        {
            # vLLM's own IP for the driver and each rank (vllm/envs.py VLLM_HOST_IP).
            "VLLM_HOST_IP": node.fabric_ip,
            "NCCL_SOCKET_IFNAME": node.fabric_interface,
            "GLOO_SOCKET_IFNAME": node.fabric_interface,
            "TP_SOCKET_IFNAME": node.fabric_interface,
            "UCX_NET_DEVICES": node.fabric_interface,
            "HF_HOME": CONTAINER_HF_HOME,
            "HF_HUB_OFFLINE": "1",
        }
    )
    env.update(compile_cache_env())
    # vLLM's own wait for its engine core (vllm/envs.py, 0.14.0 on; 600 s by default): never
    # shorter than ours, whatever timeouts.vllmReadySeconds is (its ceiling: a constant, so a
    # change of our wait replaces no container). It bounds the API server's handshake with the
    # engine core (v1/engine/core_client.py MPClient), not the model load, which with one API
    # server only our readiness wait bounds (docs/design.md, "vLLM's own time limits").
    env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(MAX_VLLM_READY_SECONDS)
    if node.rdma_hcas:
        env["NCCL_IB_HCA"] = ",".join(node.rdma_hcas)
        env.setdefault("NCCL_IB_DISABLE", "0")
        # Which transport NCCL chose is logged at communicator init (its INIT and NET
        # subsystems print there, not per collective): the readiness wait reads it from the
        # server's log and warns when RDMA was expected but sockets were used.
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    # Where vLLM's own ports start on this node (its message queues; with executor ray also the
    # driver's TCPStore): vllm.masterPort + 1 on, a range the firewall covers (MP_PORT_SPAN).
    env["VLLM_PORT"] = str(plan.master_port + 1)
    if not plan.uses_ray:
        return env
    # A driver must join the cluster, never start a private local Ray.
    env["RAY_ADDRESS"] = plan.ray_address
    # Ray's memory monitor kills tasks and actors above its host-memory threshold; on GB10 the
    # GPU's allocations (weights, KV cache) come out of the same unified memory, so the vLLM
    # ranks are its likely victims. The raylet reads this at start ("To disable worker killing,
    # set RAY_memory_monitor_refresh_ms to zero", Ray 2.60); both two-Spark references set it
    # (NVIDIA dgx-spark-playbooks nvidia/vllm, eugr/spark-vllm-docker). vllm.env may override.
    env.setdefault("RAY_memory_monitor_refresh_ms", "0")
    return env


def compile_cache_env() -> dict[str, str]:
    """Every compile cache a vLLM rank fills, in the node's bound cache directory instead of
    the container's home and /tmp, which a replacement loses. Each variable and its default:
    - VLLM_CACHE_ROOT (vllm/envs.py; ~/.cache/vllm): torch.compile artifacts under
      torch_compile_cache/<hash of the config and vLLM's version>; while compiling vLLM points
      Inductor's and Triton's caches inside it too (vllm/compilation/compiler_interface.py);
    - FLASHINFER_WORKSPACE_BASE (flashinfer/jit/env.py; the home directory): JIT kernels under
      <base>/.cache/flashinfer, compiled for the GPU (sm_121 on GB10) at first use;
    - TRITON_CACHE_DIR (triton knobs; ~/.triton/cache) and TORCHINDUCTOR_CACHE_DIR
      (torch/_inductor/runtime/cache_dir_utils.py; /tmp/torchinductor_<user>): kernels compiled
      outside vLLM's own compile step;
    - CUDA_CACHE_PATH (CUDA programming guide, environment variables; ~/.nv/ComputeCache): the
      driver's JIT cache of PTX compiled for this GPU."""
    cache = CONTAINER_COMPILE_CACHE
    return {
        "VLLM_CACHE_ROOT": f"{cache}/vllm",
        "FLASHINFER_WORKSPACE_BASE": cache,
        "TRITON_CACHE_DIR": f"{cache}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
        "CUDA_CACHE_PATH": f"{cache}/nv-compute",
    }


def ray_start_args(plan: DeploymentPlan, node: NodePlan) -> list[str]:
    """`ray start` arguments; `--block` keeps Ray the container's main process."""
    ray = plan.config.ray
    common = [
        "--block",
        f"--node-ip-address={node.fabric_ip}",
        f"--num-gpus={node.gpus}",
        f"--object-store-memory={ray.object_store_memory_bytes}",
        "--disable-usage-stats",
        *(f"{flag}={port}" for flag, port in ray.node_port_flags.items()),
        f"--min-worker-port={ray.min_worker_port}",
        f"--max-worker-port={ray.max_worker_port}",
    ]
    if node.is_head:
        return [
            "start",
            "--head",
            f"--port={ray.port}",
            "--include-dashboard=false",
            *common,
        ]
    return ["start", f"--address={plan.ray_address}", *common]


def node_lines(nodes: Iterable[NodePlan]) -> str:
    """`node|dest|bin`, one node a line (a state dir may hold a space; the config refuses `|`
    and line breaks in paths): how head-side scripts reach each node's scripts (the head: `-`)."""
    return "\n".join(
        f"{n.name}|{'-' if n.is_head else n.fabric_destination}|{n.bin_dir}" for n in nodes
    )


def node_check_specs(plan: DeploymentPlan) -> str:
    """Where the wait scripts re-check image, weights and memory: every node."""
    return node_lines(plan.nodes)


def log_specs(plan: DeploymentPlan, include_vllm: bool = False) -> str:
    """`node|dest|container` words for the diagnostics in the wait scripts (head is local: `-`)."""
    if not plan.uses_ray:
        return " ".join(
            f"{n.name}|{'-' if n.is_head else n.fabric_destination}|{plan.container_name('vllm')}"
            for n in plan.nodes
        )
    specs = [f"{plan.head.name}|-|{plan.container_name('ray-head')}"]
    specs += [
        f"{w.name}|{w.fabric_destination}|{plan.container_name('ray-worker')}" for w in plan.workers
    ]
    if include_vllm:
        specs.append(f"{plan.head.name}|-|{plan.container_name('vllm')}")
    return " ".join(specs)


@dataclass(frozen=True)
class ImageStream:
    """One serving image and its way to the nodes: pulled on the head, copied to the workers
    that run it, checked and kept there. image.ref's (`key` empty: every node, where the
    firewall's guard and the weights fetch run it too) keeps the names every stack had
    (`image-pull`...); an entry's own image is named after its ref (`image-i<8 hex of its
    sha256>-pull`...): models sharing one image share its copies, and adding or removing any
    model never renames another's image (a name taken from a slot would move when that slot's
    model goes, and replace the servers of the models left on it)."""

    key: str
    image: ImageConfig
    nodes: tuple[NodePlan, ...]  # the head (where it is pulled) and the hosts that run it
    models: tuple[ServedModel, ...]  # the servers that run it, in the fleet's order

    def named(self, base: str) -> str:
        return f"{base}-{self.key}" if self.key else base

    def later(self, value: Later) -> Later:
        if not self.key:
            return value
        component, _, field = value.name.partition(".")
        return Later(f"{component}-{self.key}.{field}")


def image_key(ref: str) -> str:
    """An entry's own image's key: `i` and 8 hex digits of its ref's sha256."""
    return "i" + hashlib.sha256(ref.encode()).hexdigest()[:8]


def image_streams(plan: DeploymentPlan) -> tuple[ImageStream, ...]:
    """image.ref's stream, then each other image an entry names, in the order of the lowest slot
    that runs it. A stream's nodes: the head (it pulls) and the hosts of the models it serves."""
    base = plan.config.image
    by_ref: dict[str, list[ServerSlot]] = {}
    for slot in sorted(plan.servers, key=lambda s: s.index):
        if slot.model.image.ref != base.ref:
            by_ref.setdefault(slot.model.image.ref, []).append(slot)
    streams = [
        ImageStream(
            "",
            base,
            plan.cluster,
            tuple(s.model for s in plan.servers if s.model.image.ref == base.ref),
        )
    ]
    for ref, slots in by_ref.items():
        hosts = {h for slot in slots for h in slot.model.hosts}
        nodes = tuple(n for n in plan.cluster if n.is_head or n.name in hosts)
        models = tuple(s.model for s in plan.servers if s.model.image.ref == ref)
        streams.append(ImageStream(image_key(ref), slots[0].model.image, nodes, models))
    return tuple(streams)


def servers_on(plan: DeploymentPlan, node: NodePlan) -> list[DeploymentPlan]:
    """The plans of the servers that run on `node` (a rank of theirs, or the server itself)."""
    return [server for server in plan.per_server if node.name in server.served.hosts]


def serving_container_names(plan: DeploymentPlan, node: NodePlan) -> list[str]:
    """This deployment's Ray and vLLM containers on `node`, with either executor (a switch of
    executors finds the other one's still running: its delete comes last): what a restart of
    the server gives back memory from. Among several models Ray's containers are the Ray
    model's (its ranks run in them), and only its."""
    others_slot = plan.server.index > 0 or plan.runs_ray  # Ray's containers are another's
    if len(plan.servers) > 1 and not plan.uses_ray and others_slot:
        return [plan.container_name("vllm")]
    ray = plan.container_name("ray-head" if node.is_head else "ray-worker")
    return [ray, plan.container_name("vllm")]


def own_container_names(plan: DeploymentPlan, node: NodePlan) -> list[str]:
    """Every container of this deployment on `node`: another deployment's container of the same
    name is refused by preflight, naming that deployment."""
    ray = plan.container_name("ray-head" if node.is_head else "ray-worker")
    servers = [server.container_name("vllm") for server in servers_on(plan, node)]
    names = [ray, *servers, plan.container_name("firewall")]
    return [*names, plan.container_name("front")] if node.is_head else names


@dataclass(frozen=True)
class ServerSizing:
    """The server's memory on every node: vLLM's --gpu-memory-utilization and, with
    vllm.kvCache, --kv-cache-memory-bytes (configured, or what the memory check derived)."""

    gpu_memory_utilization: str
    kv_cache_bytes: int | str | None = None  # str: a later value's placeholder

    def flags(self) -> list[str]:
        flags = ["--gpu-memory-utilization", self.gpu_memory_utilization]
        if self.kv_cache_bytes is not None:
            flags += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        return flags


def fixed_sizing(plan: DeploymentPlan) -> ServerSizing | None:
    """The sizing the config gives before the memory check ran (which still checks it fits);
    None when `auto` derives a part of it."""
    vllm = plan.served.settings
    if vllm.gpu_memory_utilization == "auto" or vllm.kv_cache == "auto":
        return None
    return ServerSizing(str(vllm.gpu_memory_utilization), vllm.kv_cache)


def server_sizing(plan: DeploymentPlan) -> ServerSizing:
    """The sizing vLLM's flags carry: the configured one, or with `auto` the memory check's
    (its later values, stacks/plan/later.py)."""
    fixed = fixed_sizing(plan)
    if fixed is not None:
        return fixed
    kv_cache = None
    if plan.served.settings.kv_cache is not None:
        kv_cache = plan.later(KV_CACHE_BYTES).text
    return ServerSizing(plan.later(GPU_MEMORY_UTILIZATION).text, kv_cache)


def sizing_values(sizing: ServerSizing) -> dict[str, str]:
    """A sizing the memory check chose, as the later values `server_sizing` placed."""
    values = {GPU_MEMORY_UTILIZATION.name: sizing.gpu_memory_utilization}
    if sizing.kv_cache_bytes is not None:
        values[KV_CACHE_BYTES.name] = str(sizing.kv_cache_bytes)
    return values


def checked_sizing(sizing: Mapping[str, Any]) -> ServerSizing:
    """The sizing the memory check chose (its `memory` output)."""
    kv_cache = sizing.get("kvCache")
    return ServerSizing(
        str(sizing["gpuMemoryUtilization"]),
        int(kv_cache["kvCacheBytes"]) if isinstance(kv_cache, Mapping) else None,
    )


def vllm_launcher_args(
    plan: DeploymentPlan, sizing: ServerSizing, node: NodePlan | None = None
) -> list[str]:
    """The launcher's flags (components/scripts/vllm-launcher.sh), then `--` and vLLM's, for
    the server on the head or, with executor mp, a headless `node`.

    `--expect-ips` lists every node with either executor: the memory check reads it from the
    running server to know where that server's memory is given back on a restart.
    """
    node = node or plan.server_node
    flags = [
        "--executor",
        plan.served.settings.executor,
        "--expect-ips",
        ",".join(n.fabric_ip for n in plan.nodes),
        "--gpus",
        str(plan.total_gpus),
        "--wait-seconds",
        str(plan.config.timeouts.ray_join_seconds),
        "--scripts",
        CONTAINER_SCRIPTS_DIR,
    ]
    if plan.runs_server(node):
        flags += ["--key-file", CONTAINER_API_KEY_FILE]
    if not plan.uses_ray:
        peers = plan.ranks[1:] if plan.runs_server(node) else (plan.server_node,)
        flags += [
            "--rendezvous",
            plan.rendezvous,
            "--peers",
            ",".join(f"{p.name}={p.fabric_ip}" for p in peers),
        ]
        if plan.runs_server(node):
            port = plan.server_port
            flags += ["--health-url", f"http://{plan.server_address}:{port}/health"]
    return [*flags, "--", *vllm_serve_args(plan, sizing, node)]


def vllm_serve_args(
    plan: DeploymentPlan, sizing: ServerSizing, node: NodePlan | None = None
) -> list[str]:
    """Arguments after `vllm serve` on `node` (the head by default), from typed config (never
    probed from the image) and, with `auto`, the sizing the memory check derived. With executor
    mp every node gets the same arguments but its node rank, and the workers `--headless` (vLLM
    docs, parallelism_scaling.md)."""
    served = plan.served
    settings = served.settings
    node = node or plan.server_node
    args = [
        served.id,
        "--served-model-name",
        served.served_name,
        "--revision",
        served.revision,
        "--host",
        plan.server_address,
        "--port",
        str(plan.server_port),
        "--tensor-parallel-size",
        str(served.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(settings.pipeline_parallel_size),
        "--distributed-executor-backend",
        settings.executor,
        *sizing.flags(),
    ]
    if not plan.uses_ray:
        args += [
            "--nnodes",
            str(len(plan.nodes)),
            "--node-rank",
            str(plan.node_rank(node)),
            "--master-addr",
            plan.server_node.fabric_ip,
            "--master-port",
            str(plan.master_port),
        ]
        if not plan.runs_server(node):
            args.append("--headless")
    if settings.max_model_len is not None:
        args += ["--max-model-len", str(settings.max_model_len)]
    return args + list(settings.extra_args)


def plan_deployment(
    config: StackConfig, deployment_id: str, known_hosts: Path | None
) -> DeploymentPlan:
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
    return DeploymentPlan(
        config=config, deployment_id=deployment_id, nodes=nodes, servers=servers, cluster=nodes
    )


def placed(plan: DeploymentPlan, recorded: Mapping[str, int]) -> DeploymentPlan:
    """`plan` with each server in the slot the head recorded for it (stacks/fleet.py). A slot
    beyond the fleet's size (left by removals) has its ports checked as the config's were."""
    servers = assign_slots(plan.config.fleet, recorded)
    check_ports(plan.config, max(s.index for s in servers) + 1)
    return replace(plan, servers=servers, position=0, recorded=bool(recorded))


def keeps_slot_record(plan: DeploymentPlan) -> bool:
    """The head records the slots once a stack had several models (or a model moved off slot
    0), and from then on with every change: a stale record would give a switched model a slot
    still in use. A stack that only ever served one model writes none (and plans as before)."""
    return len(plan.servers) > 1 or plan.recorded or any(s.index for s in plan.servers)


def unpinned_endpoints(plan: DeploymentPlan) -> list[str]:
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


def cluster_listen_ports(
    plan: DeploymentPlan, node: NodePlan, uses_ray: bool | None = None
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
