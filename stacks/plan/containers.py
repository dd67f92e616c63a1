"""Every Ray/vLLM container as a pure spec: image role, command, env, mounts, limits, restart.

One place for what every service container shares, so nodes cannot drift apart. The components
turn a spec into a pulumi-docker Container (components/containers.py) and add the labels that
name other resources' IDs (a Ray head's, the cluster's), which exist only once those do.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from stacks.plan.arguments import (
    node_env,
    ray_start_args,
    ray_watch_entrypoint,
    vllm_launcher_args,
)
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.container_paths import (
    CONTAINER_API_KEY_DIR,
    CONTAINER_COMPILE_CACHE,
    CONTAINER_HF_HOME,
    CONTAINER_HOST_NCCL,
    CONTAINER_RAY_DIR,
    CONTAINER_SCRIPTS_DIR,
)
from stacks.plan.firewall import (
    CONTAINER_FIREWALL_DIR,
    FIREWALLED_LABEL,
    HOST_ROOT,
    chain_name,
    firewall_dir,
    gate_args,
    guard_args,
)
from stacks.plan.front import CONTAINER_FRONT_DIR, CONTAINER_FRONT_SECRETS_DIR, FRONT_CONFIG_NAME
from stacks.plan.server_plan import ServerPlan
from stacks.plan.sizing import ServerSizing

ServiceRole = Literal["ray-head", "ray-worker", "vllm", "vllm-headless"]
Role = Literal[
    "ray-head",
    "ray-worker",
    "vllm",
    "vllm-headless",
    "front",
    "firewall",
    "prometheus",
    "grafana",
    "node-exporter",
    "memory-guard",
    "docker-filter",
]

# Ray: `on-failure` restarts a crash, and, after a reboot, the exit the shutdown caused (a
# non-zero one: daemon/daemon.go restore restarts what ShouldRestart() accepts), but not the
# clean exit of a `ray stop`, which is how a host leaving the stack leaves Ray.
# The server, and with executor mp each headless node's: `unless-stopped`, because vLLM's
# clean exit on the shutdown's SIGTERM is a 0, which `on-failure` would leave down after a
# reboot.
# The front: `unless-stopped`, as the server. The firewall guard: `always`, so that a guard stopped
# by hand still comes back at boot; without it nothing behind the gate starts.
RESTART_POLICY: dict[Role, str] = {
    "ray-head": "on-failure",
    "ray-worker": "on-failure",
    "vllm": "unless-stopped",
    "vllm-headless": "unless-stopped",
    "front": "unless-stopped",
    "firewall": "always",
    # Monitoring: back after a reboot, like the server it watches.
    "prometheus": "unless-stopped",
    "grafana": "unless-stopped",
    "node-exporter": "unless-stopped",
    # As the firewall guard: back at boot even if stopped by hand, before the servers it watches.
    "memory-guard": "always",
    # The guard's Docker socket: as the guard, which has no other.
    "docker-filter": "always",
}

# The server's Ray driver finds its node's raylet among the processes it can see (Ray 2.x), so
# the server and the Ray head must share a PID namespace. The host's, not the Ray head
# container's (`container:<head>`): joining a container's namespace fails while that container
# is not running, and Docker then gives up on the joiner for good, both when a restart's start
# fails (daemon/monitor.go) and at boot, where Docker before 29 starts containers in no order
# (daemon/daemon.go restore waits for dependencies only since moby d4e026fe20, API 1.52).
# Without Ray (executor mp) no driver looks for a raylet: the server keeps its own namespace.
HOST_PID_ROLES: frozenset[Role] = frozenset({"ray-head", "vllm"})

# Labels whose values are other resources' IDs (set by the components).
RAY_HEAD_ID_LABEL = "spark-vllm.ray-head-id"  # a worker joined this head: a new head replaces it
RAY_CLUSTER_LABEL = "spark-vllm.ray-cluster"  # the server joined this cluster (ray-joined's ID)
MP_NODES_LABEL = "spark-vllm.mp-nodes"  # mp: the headless containers the server meets
API_KEY_HASH_LABEL = "spark-vllm.api-key-sha256"  # a new key restarts vLLM; only its hash shows


def secret_label(value: str, deployment_id: str, running: str | None) -> str:
    """A secret's label (API_KEY_HASH_LABEL), whose change replaces the container: an HMAC of
    the deployment's name keyed with the secret, so that no two deployments' labels match and
    no table made in advance of keys' hashes finds it (an earlier release put the secret's bare
    sha256 there). `running`: the label of the container running under this name (facts), kept
    while it is that earlier hash of this same secret, so the upgrade replaces nothing; a new
    secret is labelled anew, as its container is replaced anyway."""
    if not value:
        return "none"
    if running is not None and running == unsalted_label(value):
        return running
    message = f"spark-vllm label {deployment_id}".encode()
    return hmac.new(value.encode(), message, hashlib.sha256).hexdigest()[:16]


def unsalted_label(value: str) -> str:
    """The secret's label as releases before issue 50's item 8 wrote it."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


MOUNTS_LABEL = "spark-vllm.mounts"


# CAP_NET_RAW is in Docker's default set: on the host's network, a container holding it can open
# raw and packet sockets on the host's interfaces, read any traffic there (a client's key in
# clear text) and forge packets from any of the host's addresses (a peer of the front's table
# handover, a fabric peer). No container of ours needs it but the firewall guard (see there):
# vLLM, Ray, NCCL (sockets, or RoCE's reliable-connected queue pairs through /dev/infiniband:
# only raw-packet queue pairs want CAP_NET_RAW) and Gloo use TCP and the verbs devices; HAProxy,
# Prometheus, Grafana and node_exporter use TCP; the memory guard has no network. Named as
# Docker stores them (see the guard's `capabilities`), so a refresh reads back what was asked.
DROPPED_CAPABILITIES = ("CAP_NET_RAW",)

# The verbs devices RoCE needs (with HCAs only; without them NCCL uses sockets).
RDMA_DEVICES = ("/dev/infiniband",)
# The main thread's stack: 64 MiB, as both two-Spark references run their containers (NVIDIA
# dgx-spark-playbooks nvidia/vllm, eugr/spark-vllm-docker run-cluster-node.sh), the setting
# NVIDIA gives for its PyTorch containers; Docker's default is the daemon's (8 MiB).
STACK_BYTES = 67108864


@dataclass(frozen=True)
class Ulimit:
    name: str
    soft: int  # -1: unlimited
    hard: int


def daemon_default_ulimits(daemon_json: str, dockerd_args: Sequence[str]) -> tuple[Ulimit, ...]:
    """The ulimits dockerd adds to every container that does not set them itself: daemon.json's
    `default-ulimits` and the `--default-ulimit NAME=SOFT[:HARD]` flags (dockerd refuses a key
    given both ways, so they never conflict). A daemon.json that is not JSON has none: dockerd
    would not have started with it."""
    found: dict[str, Ulimit] = {}
    try:
        config = json.loads(daemon_json) if daemon_json.strip() else {}
    except json.JSONDecodeError:
        config = {}
    defaults = config.get("default-ulimits") if isinstance(config, dict) else None
    for key, value in (defaults if isinstance(defaults, dict) else {}).items():
        if isinstance(value, dict) and "Soft" in value and "Hard" in value:
            name = str(value.get("Name") or key)
            found[name] = Ulimit(name, int(value["Soft"]), int(value["Hard"]))
    for flag in _default_ulimit_flags(dockerd_args):
        name, _, limits = flag.partition("=")
        soft, _, hard = limits.partition(":")
        if name and soft.lstrip("-").isdigit() and (not hard or hard.lstrip("-").isdigit()):
            found[name] = Ulimit(name, int(soft), int(hard or soft))
    return tuple(found[name] for name in sorted(found))


def _default_ulimit_flags(args: Sequence[str]) -> list[str]:
    """The values of `--default-ulimit`, given as `--default-ulimit V` or `--default-ulimit=V`."""
    values: list[str] = []
    for index, arg in enumerate(args):
        if arg.startswith("--default-ulimit="):
            values.append(arg.split("=", 1)[1])
        elif arg == "--default-ulimit" and index + 1 < len(args):
            values.append(args[index + 1])
    return values


def with_daemon_ulimits(
    ulimits: tuple[Ulimit, ...], defaults: tuple[Ulimit, ...]
) -> tuple[Ulimit, ...]:
    """A container's ulimits as dockerd stores them: its own, then each daemon default it does
    not set (daemon `mergeUlimits`). pulumi-docker's create ends with a read of the container,
    and the next `up` diffs the program's ulimits against that read (a set, ForceNew): giving
    the merged set keeps a host with `default-ulimits` from replacing every container on
    every `up`."""
    own = {ulimit.name for ulimit in ulimits}
    return ulimits + tuple(ulimit for ulimit in defaults if ulimit.name not in own)


def _ulimits(node: NodePlan) -> tuple[Ulimit, ...]:
    """RoCE registers (pins) the buffers it sends from: memlock unlimited with HCAs."""
    stack = Ulimit("stack", STACK_BYTES, STACK_BYTES)
    return (Ulimit("memlock", -1, -1), stack) if node.rdma_hcas else (stack,)


@dataclass(frozen=True)
class Mount:
    source: str  # a host path (bind), or a volume's name (volume: Docker creates it, root's)
    target: str
    read_only: bool = False
    kind: Literal["bind", "volume"] = "bind"


@dataclass(frozen=True)
class ContainerSpec:
    """One service container; host network and IPC and `--init` are common to all."""

    name: str  # the container's name on its host (fixed: replacing it deletes the old first)
    node: NodePlan
    role: Role
    entrypoint: tuple[str, ...]
    command: tuple[str, ...]
    env: tuple[str, ...]  # KEY=value, sorted
    restart: str
    host_pid: bool
    mounts: tuple[Mount, ...]
    labels: tuple[tuple[str, str], ...]  # sorted
    gpus: bool  # `--gpus all`
    shm_size_mb: int | None
    ulimits: tuple[Ulimit, ...]
    devices: tuple[str, ...]  # host device paths, at the same path inside
    stop_seconds: int = 30
    user: str | None = None  # the image's own user when None
    capabilities: tuple[str, ...] = ()  # added to Docker's default set
    # Taken from Docker's default set: DROPPED_CAPABILITIES unless the role needs one (or "ALL").
    dropped: tuple[str, ...] = DROPPED_CAPABILITIES
    network: Literal["host", "none"] = "host"  # "none": no network, and IPC Docker's default
    memory_mb: int | None = None  # a hard limit, with no swap beside it
    # Hardening; each unset is Docker's default and no input at all (no diff for a container
    # deployed before these existed: tests/engine/container_read.py).
    security_opts: tuple[str, ...] = ()  # e.g. "no-new-privileges:true"
    read_only_rootfs: bool = False
    init: bool = True  # Docker's init as PID 1; False: the entrypoint is its only process


@dataclass(frozen=True)
class EntryScripts:
    """Scripts that run as containers' entrypoints (`bash -c`), whole in the container's
    configuration: they must work before and without the host's installed scripts."""

    launcher: str  # vllm-launcher.sh
    gate: str  # firewall-gate.sh, before every Ray and vLLM entrypoint
    guard: str  # firewall.sh, the firewall container's
    exporter_gate: str  # exporter-gate.sh (POSIX sh), before node_exporter
    memory_guard: str  # memory_guard.py (`python3 -c`), the memory guard's
    docker_filter: str  # docker_filter.py (`python3 -c`), the guard's filtered Docker socket


def ray_container(
    plan: ServerPlan, node: NodePlan, mounts_token: str, scripts: EntryScripts
) -> ContainerSpec:
    """Ray (`ray start --block`), head or worker: under the Ray watch (ray.watchNodes), which
    restarts it when the head's GCS no longer lists this node, or as the main process itself."""
    role: ServiceRole = "ray-head" if node.is_head else "ray-worker"
    command = tuple(ray_start_args(plan.cluster, node))
    watched = plan.config.ray.watch_nodes
    entrypoint = tuple(ray_watch_entrypoint(plan.cluster, node)) if watched else ("ray",)
    return _service(plan, node, role, entrypoint, command, mounts_token, scripts)


def vllm_container(
    plan: ServerPlan, mounts_token: str, scripts: EntryScripts, sizing: ServerSizing
) -> ContainerSpec:
    """The server on its node (the head, or a worker for a model on workers only): the
    launcher (vllm-launcher.sh) waits for Ray's GPUs and reads the API key from a mounted
    directory, then runs `vllm serve` sized by `sizing` (the
    configured memory, or what the memory check derived)."""
    spec = _service(
        plan,
        plan.server_node,
        "vllm",
        ("bash", "-c", scripts.launcher, "vllm-launcher"),
        tuple(vllm_launcher_args(plan, sizing)),
        mounts_token,
        scripts,
    )
    api_key = Mount(plan.server_key_dir, CONTAINER_API_KEY_DIR, read_only=True)
    return replace(spec, mounts=(*spec.mounts, api_key))


def headless_container(
    plan: ServerPlan,
    node: NodePlan,
    mounts_token: str,
    scripts: EntryScripts,
    sizing: ServerSizing,
) -> ContainerSpec:
    """Executor mp: a worker's own vLLM, `--headless` with its node rank; it serves no API and
    never sees the API key."""
    return _service(
        plan,
        node,
        "vllm-headless",
        ("bash", "-c", scripts.launcher, "vllm-launcher"),
        tuple(vllm_launcher_args(plan, sizing, node)),
        mounts_token,
        scripts,
    )


def front_container(plan: ClusterPlan, mounts_token: str) -> ContainerSpec:
    """HAProxy on the head, publishing `vllm.port` (stacks/plan/front.py). It reads its
    configuration and its secrets (the key's pattern file, the named keys' maps, the handover's
    key pair: the deploying user's, mode 600, in a directory no other container mounts) as
    root, then runs as `nobody` (the configuration's `uid`). The component adds the key's hash
    label."""
    head = plan.head
    labels = {
        **plan.labels,
        "spark-vllm.role": "front",
        "spark-vllm.node": head.name,
        MOUNTS_LABEL: mounts_token,
    }
    return ContainerSpec(
        name=plan.container_name("front"),
        node=head,
        role="front",
        entrypoint=("haproxy",),
        # Master-worker (-W): a changed configuration is reloaded (front-reload.sh), not a
        # restart that would drop the streams in flight.
        command=("-W", "-db", "-f", f"{CONTAINER_FRONT_DIR}/{FRONT_CONFIG_NAME}"),
        env=(),
        restart=RESTART_POLICY["front"],
        host_pid=False,
        mounts=(
            Mount(f"{head.state_dir}/front", CONTAINER_FRONT_DIR, read_only=True),
            Mount(plan.front_secrets_dir, CONTAINER_FRONT_SECRETS_DIR, read_only=True),
        ),
        labels=tuple(sorted(labels.items())),
        gpus=False,
        shm_size_mb=None,
        ulimits=(),
        devices=(),
        stop_seconds=5,
        user="0:0",
    )


def firewall_container(
    plan: ClusterPlan, node: NodePlan, mounts_token: str, scripts: EntryScripts
) -> ContainerSpec:
    """The guard (components/scripts/firewall.sh): the host's own iptables through a read-only
    view of its root, with CAP_NET_ADMIN (CAP_NET_RAW for legacy iptables) in the host's
    network namespace; its marker directory is the one thing it writes."""
    labels = {
        **plan.labels,
        "spark-vllm.role": "firewall",
        "spark-vllm.node": node.name,
        MOUNTS_LABEL: mounts_token,
    }
    marker_dir = firewall_dir(node)
    return ContainerSpec(
        name=plan.container_name("firewall"),
        node=node,
        role="firewall",
        entrypoint=("bash", "-c", scripts.guard, "firewall"),
        command=tuple(guard_args(plan, node)),
        env=(),
        restart=RESTART_POLICY["firewall"],
        host_pid=False,
        mounts=(
            Mount("/", HOST_ROOT, read_only=True),
            Mount(marker_dir, f"{HOST_ROOT}{marker_dir}"),
        ),
        labels=tuple(sorted(labels.items())),
        gpus=False,
        shm_size_mb=None,
        ulimits=(),
        devices=(),
        stop_seconds=5,
        user="0:0",
        # As Docker stores them (upper case, `CAP_` prefixed): pulumi-docker's read writes back
        # what Docker reports and `capabilities` has no DiffSuppressFunc, so `NET_ADMIN` would
        # replace the guard at every `pulumi up --refresh` (tests/engine/container_read.py).
        # CAP_NET_RAW kept, the one container that needs it: legacy iptables (libiptc, the
        # host's `iptables-legacy`, as on hosts whose rules predate nftables) reads and writes
        # the tables through a SOCK_RAW socket (getsockopt/setsockopt IPT_SO_*), which the
        # kernel opens only with CAP_NET_RAW; iptables-nft needs only CAP_NET_ADMIN (netlink).
        # The guard must run whichever the host's rules are in (firewall.sh chooses).
        capabilities=("CAP_NET_ADMIN", "CAP_NET_RAW"),
        dropped=(),
    )


# The memory guard's own bound: a Python loop reading two /proc files; measured at about 10 MiB.
# The same for its Docker filter (one small request at a time).
MEMORY_GUARD_MB = 64

# Where the filter's socket is, in both containers: a Docker volume only these two mount (on
# the host under /var/lib/docker, root's only), created by Docker as root's, mode 0755.
FILTER_DIR = "/run/spark-vllm-docker"
FILTER_SOCKET = f"{FILTER_DIR}/docker.sock"
# No capability at all (the raw socket is the owner's, root's; the volume is root's), no gain
# of any through an exec, nothing written outside the volume.
HARDENED_CAP_DROP = ("ALL",)
HARDENED_SECURITY_OPTS = ("no-new-privileges:true",)


def filter_volume(plan: ClusterPlan) -> str:
    """The volume holding the filter's socket (one per node's daemon)."""
    return f"{plan.container_name('docker-filter')}-socket"


def memory_guard_container(
    plan: ClusterPlan, node: NodePlan, scripts: EntryScripts
) -> ContainerSpec:
    """The memory guard on `node` (components/scripts/memory_guard.py, from the serving image):
    no network, 64 MiB, no capability, and no Docker socket but the filter's
    (`docker_filter_container`), through which it can only list, inspect and kill this
    deployment's servers on the node. /proc/meminfo and /proc/pressure/memory are the host's in
    any container (not namespaced)."""
    guard = plan.config.memory_guard
    command = {
        "--node": node.name,
        "--deployment": plan.deployment_id,
        "--min-available": guard_floor(guard.min_available_gib),
        "--max-pressure-percent": f"{guard.max_pressure_percent:g}",
        # A start the readiness wait gave up on is no longer the one it waits for.
        "--start-window-seconds": str(plan.config.timeouts.vllm_ready_seconds),
        "--docker-socket": FILTER_SOCKET,
    }
    labels = {**plan.labels, "spark-vllm.role": "memory-guard", "spark-vllm.node": node.name}
    return ContainerSpec(
        name=plan.container_name("memory-guard"),
        node=node,
        role="memory-guard",
        entrypoint=("python3", "-c", scripts.memory_guard),
        command=tuple(word for pair in command.items() for word in pair),
        env=(),
        restart=RESTART_POLICY["memory-guard"],
        host_pid=False,
        mounts=(Mount(filter_volume(plan), FILTER_DIR, read_only=True, kind="volume"),),
        labels=tuple(sorted(labels.items())),
        gpus=False,
        shm_size_mb=None,
        ulimits=(),
        devices=(),
        stop_seconds=5,
        user="0:0",
        network="none",
        memory_mb=MEMORY_GUARD_MB,
        dropped=HARDENED_CAP_DROP,
        security_opts=HARDENED_SECURITY_OPTS,
        read_only_rootfs=True,
    )


def docker_filter_container(
    plan: ClusterPlan, node: NodePlan, scripts: EntryScripts
) -> ContainerSpec:
    """The guard's Docker socket on `node` (components/scripts/docker_filter.py, from the
    serving image): the only container of the stack holding the host's Docker socket. It
    forwards the guard's four calls on this deployment's servers on the node and refuses the
    rest. Its own PID namespace (the host's is the head's Ray and server's, with executor ray),
    no network, no capability, no exec that gains any, a read-only root, and no init: the
    filter is its only process, and it marks itself non-dumpable, so no process sharing a PID
    namespace with it reaches the raw socket through /proc/<pid>/root."""
    command = {
        "--deployment": plan.deployment_id,
        "--node": node.name,
        "--listen": FILTER_SOCKET,
        "--docker": DOCKER_SOCKET,
    }
    labels = {**plan.labels, "spark-vllm.role": "docker-filter", "spark-vllm.node": node.name}
    return ContainerSpec(
        name=plan.container_name("docker-filter"),
        node=node,
        role="docker-filter",
        # -I: no PYTHON* variable or user site of the image's; -S: no site, a shorter start
        # before the filter is non-dumpable.
        entrypoint=("python3", "-I", "-S", "-c", scripts.docker_filter),
        command=tuple(word for pair in command.items() for word in pair),
        env=(),
        restart=RESTART_POLICY["docker-filter"],
        host_pid=False,
        mounts=(
            Mount(DOCKER_SOCKET, DOCKER_SOCKET),
            Mount(filter_volume(plan), FILTER_DIR, kind="volume"),
        ),
        labels=tuple(sorted(labels.items())),
        gpus=False,
        shm_size_mb=None,
        ulimits=(),
        devices=(),
        stop_seconds=5,
        user="0:0",
        network="none",
        memory_mb=MEMORY_GUARD_MB,
        dropped=HARDENED_CAP_DROP,
        security_opts=HARDENED_SECURITY_OPTS,
        read_only_rootfs=True,
        init=False,
    )


# The daemon's socket, where `docker system dial-stdio` (the provider's SSH connection) finds it.
DOCKER_SOCKET = "/var/run/docker.sock"


def guard_floor(min_available_gib: float | Literal["auto"]) -> str:
    """memoryGuard.minAvailableGib as the guard's --min-available: `auto` or bytes."""
    if min_available_gib == "auto":
        return "auto"
    return str(int(min_available_gib * 1073741824))


def _gated(
    plan: ServerPlan, node: NodePlan, entrypoint: tuple[str, ...], scripts: EntryScripts
) -> tuple[str, ...]:
    """`entrypoint` behind the firewall gate (firewall-gate.sh), when the firewall is on."""
    if not plan.config.fabric.firewall:
        return entrypoint
    return ("bash", "-c", scripts.gate, "firewall-gate", *gate_args(plan, node), "--", *entrypoint)


def _service(
    plan: ServerPlan,
    node: NodePlan,
    role: ServiceRole,
    entrypoint: tuple[str, ...],
    command: tuple[str, ...],
    mounts_token: str,
    scripts: EntryScripts,
) -> ContainerSpec:
    """GPUs, RDMA when the node has HCAs, the HF cache, Ray's session dir and the probes.

    `mounts_token` changes when a bound host directory was recreated (components/facts.py): the
    label makes that a replacement, so no container stays bound to a directory that is gone.

    Restart policies (moby daemon/internal/restartmanager): every restart waits 100 ms,
    doubling up to 1 min while a container keeps exiting within 10 s, so a crash loop backs
    off; there is no retry bound, because Docker counts retries per container lifetime. See
    RESTART_POLICY for which policy and why.
    """
    cfg = plan.config
    labels = {
        **plan.cluster.labels,
        "spark-vllm.role": role,
        "spark-vllm.node": node.name,
        MOUNTS_LABEL: mounts_token,
    }
    gate: tuple[Mount, ...] = ()
    if cfg.fabric.firewall:
        labels[FIREWALLED_LABEL] = chain_name(plan.cluster)
        gate = (Mount(firewall_dir(node), CONTAINER_FIREWALL_DIR, read_only=True),)
    # vllm.hostNccl: the host's NCCL, which node_env points vLLM and torch at.
    host_nccl = (
        (Mount(node.host_nccl, CONTAINER_HOST_NCCL, read_only=True),) if node.host_nccl else ()
    )
    return ContainerSpec(
        name=_service_name(plan, role),
        node=node,
        role=role,
        entrypoint=_gated(plan, node, entrypoint, scripts),
        command=command,
        env=tuple(f"{key}={value}" for key, value in sorted(node_env(plan, node).items())),
        restart=RESTART_POLICY[role],
        host_pid=role in HOST_PID_ROLES and plan.uses_ray,
        mounts=(
            # Read-only: only the weights steps write the cache (as the SSH user), so a server,
            # or whatever runs in its image, can neither change a model's files nor plant one.
            Mount(cfg.model.cache_dir, CONTAINER_HF_HOME, read_only=True),
            Mount(node.ray_dir, CONTAINER_RAY_DIR),
            Mount(node.bin_dir, CONTAINER_SCRIPTS_DIR, read_only=True),
            Mount(node.compile_cache_dir, CONTAINER_COMPILE_CACHE),
            *gate,
            *host_nccl,
        ),
        labels=tuple(sorted(labels.items())),
        gpus=cfg.docker.request_gpus,
        shm_size_mb=cfg.docker.shm_size_mb,
        ulimits=_ulimits(node),
        devices=RDMA_DEVICES if node.rdma_hcas else (),
    )


def _service_name(plan: ServerPlan, role: ServiceRole) -> str:
    if role in ("ray-head", "ray-worker"):
        return plan.cluster.container_name("ray-head" if role == "ray-head" else "ray-worker")
    return plan.vllm_container
