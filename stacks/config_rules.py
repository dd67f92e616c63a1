"""The checks across keys: each a plain function of the typed config that returns its first
problem, keyed as the user writes the key (`hosts[1].fabricIp: ...`), or None.

RULES lists them in the order they run, each with the sentence docs/configuration.md shows for
it. Checks stop at the first problem: later rules read what earlier ones guarantee (unique host
names, hosts that exist, a tensorParallelSize for every model). What one value may be is the
schema's (stacks/schema.py, stacks/config_types.py); StackConfig (stacks/config.py) runs these.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from pydantic.alias_generators import to_camel

from stacks.config_types import MAX_PORT, default_state_dir, inside
from stacks.fleet import (
    MAX_NODE_SHARE,
    MIN_AUTO_SHARE,
    MP_PORT_SPAN,
    SERVER_OVERHEAD_SHARE,
    ServedModel,
    budget_problem,
    fleet_of,
)
from stacks.schema import ImageConfig, ServerSettings, StackSchema
from stacks.vllm_flags import (
    COMPILE_CACHE_ENV_KEYS,
    CONFIG_FILE_FLAG,
    DERIVED_ENV_KEYS,
    KV_CACHE_FLAGS,
    LISTENER_FLAG_NAMES,
    MP_ONLY_FLAGS,
    TIMEOUT_ENV_KEYS,
    flag_reached,
    reaches,
)
from stacks.vllm_listeners import LISTENER_ENV, LISTENER_FLAGS

# The host name `via` uses for the jump host: no host may take it.
BASTION = "bastion"


class ConfigError(ValueError):
    """One configuration problem, already phrased for the user (key path first)."""


def _unique_host_names(cfg: StackSchema) -> str | None:
    seen: set[str] = set()
    for index, host in enumerate(cfg.hosts):
        if host.name == BASTION:
            return f"hosts[{index}].name: {BASTION!r} is reserved for the bastion"
        if host.name in seen:
            return f"hosts[{index}].name: {host.name!r} is used by two hosts"
        seen.add(host.name)
    return None


def _unique_fabric_ips(cfg: StackSchema) -> str | None:
    seen: dict[ipaddress.IPv4Address, str] = {}
    for index, host in enumerate(cfg.hosts):
        if host.fabric_ip in seen:
            return f"hosts[{index}].fabricIp: {host.fabric_ip} is also {seen[host.fabric_ip]}'s"
        seen[host.fabric_ip] = host.name
    return None


def _fabric_apart_from_management(cfg: StackSchema) -> str | None:
    """A host whose SSH address is its own fabric IP, reached from outside the cluster (directly
    or through the bastion), is on a fabric that is the management network: the firewall admits
    everything that arrives on the fabric interface, the whole LAN. Through another host (`via`,
    the seeds' jump topology) SSH arrives over the fabric from a cluster member: fine."""
    if cfg.fabric.shared_with_management:
        return None
    names = {host.name for host in cfg.hosts}
    for index, host in enumerate(cfg.hosts):
        if host.address == str(host.fabric_ip) and host.via not in names:
            return (
                f"hosts[{index}].address: {host.address} is {host.name}'s fabricIp, so SSH from "
                "outside the cluster reaches it over the fabric: the firewall admits whatever "
                "arrives there to Ray's and vLLM's ports, the whole LAN if the fabric is the "
                "management network. Use the host's management address, reach it `via` another "
                "host, or set fabric.sharedWithManagement: true if no one else is on that network"
            )
    return None


def _one_head(cfg: StackSchema) -> str | None:
    marked = [i for i, h in enumerate(cfg.hosts) if h.head]
    if len(marked) > 1:
        return (
            f"hosts[{marked[1]}].head: only one host can be the Ray head "
            f"(hosts[{marked[0]}] is marked too)"
        )
    return None


def _via_targets_exist(cfg: StackSchema) -> str | None:
    names = {h.name: h for h in cfg.hosts}
    for index, host in enumerate(cfg.hosts):
        if host.via is None:
            continue
        key = f"hosts[{index}].via"
        if host.via == host.name:
            return f"{key}: {host.name} cannot be reached through itself"
        if host.via == BASTION:
            if cfg.bastion is None:
                return f"{key}: says 'bastion' but no bastion is configured"
            continue
        if host.via not in names:
            return f"{key}: {host.via!r} is neither a host name ({', '.join(names)}) nor 'bastion'"
        jump = names[host.via]
        # pulumi-command allows exactly one ProxyJump hop, so a jump host must be direct.
        if jump.via is not None:
            return (
                f"{key}: {host.name} -> {jump.name} -> {jump.via} is a chain of two jump hosts; "
                "pulumi-command supports one hop. Reach the host through the bastion "
                "or a directly reachable host instead."
            )
    return None


def _models_named_once(cfg: StackSchema) -> str | None:
    """One model as `model` + `vllm`, or every model in `models`: never both."""
    per_server = set(ServerSettings.model_fields)
    if cfg.models is None:
        if cfg.model.id is None:
            return "model.id: is required (or list the models under `models`)"
        if cfg.vllm.tensor_parallel_size is None:
            return "vllm.tensorParallelSize: is required (or list the models under `models`)"
        return None
    for field in ("id", "revision", "include", "exclude", "served_name"):
        if field in cfg.model.model_fields_set:
            return (
                f"model.{to_camel(field)}: `models` lists the models; set it on each entry "
                "there (model keeps cacheDir)"
            )
    for field in sorted(per_server & cfg.vllm.model_fields_set):
        return (
            f"vllm.{to_camel(field)}: `models` lists the models; set it on each entry there "
            "(vllm keeps the stack's port, listen, serverPort, masterPort and compileCache)"
        )
    return None


def _model_hosts_exist(cfg: StackSchema) -> str | None:
    names = [h.name for h in cfg.hosts]
    for index, entry in enumerate(cfg.models or ()):
        seen: set[str] = set()
        for at, name in enumerate(entry.hosts or ()):
            if name not in names:
                return (
                    f"models[{index}].hosts[{at}]: no host is named {name!r} "
                    f"(hosts: {', '.join(names)})"
                )
            if name in seen:
                return f"models[{index}].hosts[{at}]: {name} is listed twice"
            seen.add(name)
    return None


def _gpus_match_parallelism(cfg: StackSchema) -> str | None:
    gpus = {h.name: h.gpus for h in cfg.hosts}
    for model in fleet_of(cfg):
        total = sum(gpus[name] for name in model.hosts)
        key, tp = model.settings_key, model.tensor_parallel_size
        pp = model.settings.pipeline_parallel_size
        whose = (
            "the hosts" if model.hosts == tuple(gpus) else f"its hosts ({', '.join(model.hosts)})"
        )
        if model.world_size != total:
            return (
                f"{key}.tensorParallelSize x {key}.pipelineParallelSize = {tp} x {pp} = "
                f"{model.world_size}, but {whose} declare {total} GPU(s) in all; they must be "
                "equal"
            )
    return None


def _executor_places_every_rank(cfg: StackSchema) -> str | None:
    """vLLM's mp executor starts world_size // nnodes workers on every node
    (v1/executor/multiproc_executor.py) and asserts that the world size divides evenly
    (engine/arg_utils.py): a node with more or fewer GPUs cannot be placed. Ray places any."""
    index_of = {h.name: i for i, h in enumerate(cfg.hosts)}
    for model in fleet_of(cfg):
        if model.settings.executor != "mp":
            continue
        key, world, nodes = model.settings_key, model.world_size, len(model.hosts)
        if world % nodes != 0:
            return (
                f"{key}.executor: mp places world_size / nnodes ranks on every node, and "
                f"{world} ranks (tensorParallelSize x pipelineParallelSize) do not divide evenly "
                f"across {nodes} hosts; use executor ray, or hosts with equal GPU counts"
            )
        per_node = world // nodes
        for name in model.hosts:
            host = cfg.hosts[index_of[name]]
            if host.gpus != per_node:
                return (
                    f"hosts[{index_of[name]}].gpus: {host.name} declares {host.gpus} GPU(s), but "
                    f"{key}.executor mp places {per_node} rank(s) on every node ({world} ranks "
                    f"over {nodes} hosts); mixed GPU counts need executor ray"
                )
    return None


def _benchmark_fits_the_context(cfg: StackSchema) -> str | None:
    """A benchmark request longer than the model's context is refused by vLLM (400), every one
    of them, after a whole deployment: say so before."""
    wanted = cfg.vllm.benchmark
    if wanted is None:
        return None
    for model in fleet_of(cfg):
        limit = model.settings.max_model_len
        if limit is not None and wanted.input_tokens + wanted.output_tokens > limit:
            return (
                f"vllm.benchmark.inputTokens: {wanted.input_tokens} + outputTokens "
                f"{wanted.output_tokens} is more than {model.settings_key}.maxModelLen {limit}; "
                "vLLM refuses such requests"
            )
    return None


def _served_names_distinct(cfg: StackSchema) -> str | None:
    """Entries with one served name are replicas of one model (the same id, revision and
    include/exclude patterns); one name for two different models, or for two cuts of one
    snapshot, would make requests for it land on either."""
    first: dict[str, ServedModel] = {}
    for model in fleet_of(cfg):
        other = first.setdefault(model.served_name, model)
        if (other.id, other.revision) != (model.id, model.revision):
            return (
                f"{model.model_key}.servedName: {model.served_name!r} is already "
                f"{other.model_key}'s name for {other.id}@{other.revision}, and this entry "
                f"serves {model.id}@{model.revision}; give it a servedName of its own (entries "
                "with one servedName are replicas of one model)"
            )
        if (other.include, other.exclude) != (model.include, model.exclude):
            return (
                f"{model.model_key}.include/exclude: {model.served_name!r} is also "
                f"{other.model_key}'s, whose patterns differ (include {list(other.include)}, "
                f"exclude {list(other.exclude)}; here include {list(model.include)}, exclude "
                f"{list(model.exclude)}); replicas serve the same files: give both the same "
                "patterns, or this entry a servedName of its own"
            )
    return None


def _keys_named_once_for_served_models(cfg: StackSchema) -> str | None:
    """A key's name labels its metrics and its rate: two keys with one name would share both.
    A model a key names must be one the fleet serves (a typo would refuse every request)."""
    served = list(dict.fromkeys(model.served_name for model in fleet_of(cfg)))
    seen: set[str] = set()
    for index, key in enumerate(cfg.keys or ()):
        if key.name in seen:
            return f"keys[{index}].name: {key.name!r} is used by two keys"
        seen.add(key.name)
        for position, name in enumerate(key.models or ()):
            if name not in served:
                return (
                    f"keys[{index}].models[{position}]: {name!r} is not a model this stack "
                    f"serves (its served names: {', '.join(served)})"
                )
    return None


def _ray_servers_apart(cfg: StackSchema) -> str | None:
    """vLLM's Ray executor asks Ray for whole GPUs (a placement group of {"GPU": 1} bundles,
    vllm/v1/executor/ray_utils.py initialize_ray_cluster): on a node whose GPU one Ray server
    holds, a second finds none ("Current node has no GPU available"). mp servers and Ray's
    share a node (neither asks Ray for the GPU the other uses)."""
    ray_models = [m for m in fleet_of(cfg) if m.settings.executor == "ray"]
    for index, model in enumerate(ray_models):
        for other in ray_models[:index]:
            shared = [h for h in model.hosts if h in other.hosts]
            if shared:
                return (
                    f"{model.settings_key}.executor: ray, like {other.settings_key}, on "
                    f"{', '.join(shared)}: vLLM's Ray executor takes each node's whole GPU, so "
                    "two Ray servers cannot share a node; use executor mp for one of them"
                )
    return None


def _one_setting_per_image(cfg: StackSchema) -> str | None:
    """Entries naming one ref share one copy of it (and image.ref's, its settings): the same
    ref with other settings (platform, keepOnDestroy, keepPrevious) would be ambiguous."""
    first: dict[str, tuple[str, ImageConfig]] = {cfg.image.ref: ("image", cfg.image)}
    for model in fleet_of(cfg):
        where, settings = first.setdefault(
            model.image.ref, (f"{model.model_key}.image", model.image)
        )
        if settings != model.image:
            return (
                f"{model.model_key}.image: {model.image.ref} is also {where}'s, with other "
                "settings (platform, keepOnDestroy, keepPrevious); give both the same, or "
                f"leave {model.model_key}.image out to use {where}'s"
            )
    return None


def _memory_budget_fits(cfg: StackSchema) -> str | None:
    return budget_problem(fleet_of(cfg), [h.name for h in cfg.hosts])


def _placement_deployable(cfg: StackSchema) -> str | None:
    """What this release deploys: every model on the hosts it lists, each host serving some
    model; at most one of them with Ray (two Ray models sharing a node are refused
    above), its hosts the head's Ray cluster."""
    placed = {host for model in fleet_of(cfg) for host in model.hosts}
    for index, host in enumerate(cfg.hosts):
        if host.name not in placed:
            return (
                f"hosts[{index}]: no model is placed on {host.name}; list it in a model's "
                "hosts, or remove it"
            )
    if len(fleet_of(cfg)) == 1:
        return None
    head = cfg.head.name
    for model in fleet_of(cfg):
        if model.settings.executor == "ray" and head not in model.hosts:
            return (
                f"{model.settings_key}.hosts: a Ray model runs on the head ({head}), where "
                "Ray's head and the model's server (its driver) run; add it to hosts, or set "
                "executor: mp"
            )
    return None


def _ports_distinct(cfg: StackSchema) -> str | None:
    return ports_problem(cfg, len(fleet_of(cfg)))


def check_ports(cfg: StackSchema, slots: int) -> None:
    """ports_problem as an error: the plan checks the slots the head recorded (a slot beyond
    the fleet's size, left by removals) as the config's were checked."""
    problem = ports_problem(cfg, slots)
    if problem:
        raise ConfigError(problem)


def ports_problem(cfg: StackSchema, slots: int) -> str | None:
    """The published port, Ray's and those of `slots` servers are distinct and outside each
    other's ranges. Server k takes serverPort + k and masterPort + k * (MP_PORT_SPAN + 1), its
    message queues the MP_PORT_SPAN ports after that (stacks/fleet.py ServerSlot)."""
    ray = cfg.ray
    owners: dict[int, str] = {}
    ports = {
        "vllm.port": cfg.vllm.port,
        "vllm.serverPort": cfg.vllm.server_port,
        "vllm.masterPort": cfg.vllm.master_port,
        "front.metricsPort": cfg.front.metrics_port,
        # Checked whether or not monitoring is on: the node exporter's port is always guarded.
        "monitoring.nodeExporter.port": cfg.monitoring.node_exporter.port,
        **(
            {
                "monitoring.prometheus.port": cfg.monitoring.prometheus.port,
                **(
                    {"monitoring.grafana.port": cfg.monitoring.grafana.port}
                    if cfg.monitoring.grafana.enabled
                    else {}
                ),
            }
            if cfg.monitoring.enabled
            else {}
        ),
    }
    queues = [(cfg.vllm.master_port + 1, cfg.vllm.master_port + MP_PORT_SPAN, "vllm.masterPort")]
    for k in range(1, slots):
        step = k * (MP_PORT_SPAN + 1)
        ports[f"vllm.serverPort + {k} (server {k + 1})"] = cfg.vllm.server_port + k
        master = f"vllm.masterPort + {step} (server {k + 1})"
        ports[master] = cfg.vllm.master_port + step
        queues.append((ports[master] + 1, ports[master] + MP_PORT_SPAN, master))
    first, last = queues[0][0], queues[-1][1]
    span = last - cfg.vllm.master_port
    own_ports = f"vllm.masterPort + 1 to + {span}: {first}-{last}"
    if last > MAX_PORT:
        return (
            f"vllm.masterPort: {cfg.vllm.master_port} puts vLLM's own ports ({own_ports}) past "
            f"{MAX_PORT}; use a masterPort of at most {MAX_PORT - span}"
        )
    if first <= ray.max_worker_port and ray.min_worker_port <= last:
        return (
            f"vllm.masterPort: vLLM's own ports ({own_ports}) overlap "
            f"ray.minWorkerPort..maxWorkerPort ({ray.min_worker_port}-{ray.max_worker_port}); "
            "move one of them"
        )
    ranges = [
        *((low, high, "vllm.masterPort", f"vLLM's message queues ({owner} + 1 to + "
           f"{MP_PORT_SPAN})") for low, high, owner in queues),
        (ray.min_worker_port, ray.max_worker_port, "ray.minWorkerPort", "Ray's worker ports "
         "(ray.minWorkerPort..maxWorkerPort)"),
    ]  # fmt: skip
    ssh_problem = _ssh_ports_apart(cfg, {**ports, **ray.fixed_ports}, ranges)
    if ssh_problem:
        return ssh_problem
    for key, port in {**ports, **ray.fixed_ports}.items():
        for low, high, owner in queues:
            if low <= port <= high:
                return (
                    f"{key}: {port} is inside the ports vLLM's message queues use ({owner} + 1 "
                    f"to + {MP_PORT_SPAN}: {low}-{high}); use another port, or move "
                    "vllm.masterPort"
                )
        if port in owners:
            return f"{key}: {port} is also {owners[port]}"
        if ray.min_worker_port <= port <= ray.max_worker_port:
            return (
                f"{key}: {port} is inside ray.minWorkerPort..maxWorkerPort "
                f"({ray.min_worker_port}-{ray.max_worker_port})"
            )
        owners[port] = key
    return None


def ssh_ports(cfg: StackSchema) -> dict[int, str]:
    """Every port SSH may arrive on at a host of the stack, and whose it is: each host's, the
    bastion's (it may be one of the hosts), and 22 (the sshd a host's own console users reach,
    whatever port the stack dials)."""
    ports = {22: "SSH's own port 22"}
    if cfg.bastion is not None:
        ports.setdefault(cfg.bastion.port, "bastion.port (the bastion's SSH)")
    for index, host in enumerate(cfg.hosts):
        ports.setdefault(host.port, f"hosts[{index}].port ({host.name}'s SSH)")
    return ports


def _ssh_ports_apart(
    cfg: StackSchema, ports: dict[str, int], ranges: list[tuple[int, int, str, str]]
) -> str | None:
    """No port the stack listens on or the firewall drops is an SSH port: the guard drops its
    ports on every interface but loopback and the fabric, on every host, and comes back at each
    boot, so SSH inside them would be cut for good (only a console recovers)."""
    ssh = ssh_ports(cfg)
    for key, port in ports.items():
        if port in ssh:
            return (
                f"{key}: {port} is {ssh[port]}; the firewall would drop it on every host's "
                "management network, cutting SSH for good: use another port"
            )
    for low, high, key, what in ranges:
        held = sorted(port for port in ssh if low <= port <= high)
        if held:
            return (
                f"{key}: {what} cover {low}-{high}, which holds {ssh[held[0]]} "
                f"({held[0]}); the firewall drops that range on every host's management "
                "network, cutting SSH for good: move the range or SSH's port"
            )
    return None


# What vllm.hostNccl sets in every Ray and vLLM container (stacks/plan/nccl.py).
HOST_NCCL_ENV_KEYS = ("VLLM_NCCL_SO_PATH", "LD_PRELOAD")


def _host_nccl_owns_its_variables(cfg: StackSchema) -> str | None:
    """vllm.hostNccl points vLLM and torch at the host's NCCL: env may not point them elsewhere."""
    if not cfg.vllm.host_nccl:
        return None
    for model in fleet_of(cfg):
        for key in HOST_NCCL_ENV_KEYS:
            if key in model.settings.env:
                return (
                    f"{model.settings_key}.env.{key}: vllm.hostNccl sets it (to the host's NCCL, "
                    f"mounted in every container); remove it from {model.settings_key}.env, or "
                    "set vllm.hostNccl: false"
                )
    return None


def _no_user_overrides(cfg: StackSchema) -> str | None:
    for model in fleet_of(cfg):
        problem = _no_user_overrides_of(model.settings, model.settings_key)
        if problem:
            return problem
    return None


def _no_user_overrides_of(settings: ServerSettings, prefix: str) -> str | None:
    for key in settings.env:
        if key in TIMEOUT_ENV_KEYS:
            return (
                f"{prefix}.env.{key}: spark-vllm sets it at each start from "
                f"{TIMEOUT_ENV_KEYS[key]}; set those instead and remove it from {prefix}.env"
            )
        if key in DERIVED_ENV_KEYS:
            return (
                f"{prefix}.env.{key}: is derived per node by spark-vllm (from hosts[].fabricIp, "
                "fabricInterface, rdmaHcas, model, timeouts and secrets); remove it from "
                f"{prefix}.env"
            )
        if key in COMPILE_CACHE_ENV_KEYS:
            return (
                f"{prefix}.env.{key}: spark-vllm keeps this cache in each node's compile-cache "
                f"directory, so a replaced server starts warm; remove it from {prefix}.env"
            )
    for key in settings.env:
        if key in LISTENER_ENV:
            return (
                f"{prefix}.env.{key}: {LISTENER_ENV[key]}; spark-vllm's firewall cannot know "
                "what it opens, so a stack may not set it"
            )
    mp = settings.executor == "mp"
    for key in settings.env:
        if mp and key.startswith("RAY_"):
            return (
                f"{prefix}.env.{key}: no Ray runs with {prefix}.executor mp; remove it, or use "
                "executor ray"
            )
    for index, arg in enumerate(settings.extra_args):
        if not arg.strip():
            # pulumi-docker refuses a container whose command holds an empty value ("values for
            # command may not be empty"), after every step before the container ran.
            return (
                f"{prefix}.extraArgs[{index}]: an empty word: each item is one argument of "
                "`vllm serve` (the container's command refuses an empty one); remove it"
            )
        reached = flag_reached(arg)
        if reached is None:
            continue
        name, flags = reached
        key = f"{prefix}.extraArgs[{index}]"
        written = arg.split("=", 1)[0]
        shown = (
            flags[0] if flags == [written] else f"{written} (vLLM reads it as {' or '.join(flags)})"
        )
        listener = reaches(arg, LISTENER_FLAG_NAMES)
        if listener:
            return (
                f"{key}: {written} {LISTENER_FLAGS[listener[0]]}; spark-vllm's firewall cannot "
                "know what it opens, so a stack may not set it"
            )
        if CONFIG_FILE_FLAG in flags:
            return (
                f"{key}: {shown} makes vLLM read more arguments from a YAML file on the head, "
                "where any flag spark-vllm sets (--api-key, --port, ...) could be set past "
                f"these checks; write the flags in {prefix}.extraArgs instead"
            )
        if any(flag in MP_ONLY_FLAGS for flag in flags) and not mp:
            return (
                f"{key}: {shown} is for vLLM's multi-node mode without Ray, "
                f"which vLLM refuses with the Ray executor; set {prefix}.executor: mp instead "
                "(spark-vllm then sets it per node)"
            )
        if name.startswith("--ray-") and mp:
            return (
                f"{key}: {name} configures vLLM's Ray executor; "
                f"{prefix}.executor is mp (no Ray): remove it, or use executor ray"
            )
        if settings.kv_cache is not None and reaches(arg, KV_CACHE_FLAGS):
            return f"{key}: {written} sizes the KV cache, as {prefix}.kvCache does: set one of them"
        if flags:
            hint = (
                "set the apiKey secret instead (pulumi config set --secret apiKey ...)"
                if flags == ["--api-key"]
                else "it is set from the typed vllm/model settings"
            )
            return f"{key}: {shown} is managed by spark-vllm; {hint}"
    return None


def _cache_apart_from_state(cfg: StackSchema) -> str | None:
    """The weights cache and a host's state directory must not hold one another: the program
    removes its state on destroy, and copies whole cache trees between hosts."""
    cache = cfg.model.cache_dir
    for index, host in enumerate(cfg.hosts):
        state = host.state_dir or default_state_dir(host.user)
        if not (inside(cache, state) or inside(state, cache)):
            continue
        if host.state_dir is not None:
            return (
                f"hosts[{index}].stateDir: {state} and model.cacheDir {cache} overlap (one is "
                "inside the other); give spark-vllm's state a directory of its own, apart from "
                "the weights"
            )
        return (
            f"model.cacheDir: {cache} overlaps {host.name}'s state directory {state} (the "
            f"default for user {host.user}, as hosts[{index}].stateDir is not set); use another "
            "cacheDir, e.g. /home/<user>/.cache/huggingface, or set hosts[].stateDir apart from it"
        )
    return None


@dataclass(frozen=True)
class Rule:
    """A check across keys, and what it asks of a stack in one sentence (the reference's)."""

    check: Callable[[StackSchema], str | None]
    summary: str


# In the order they run: each may rely on what the ones above it guarantee.
RULES: tuple[Rule, ...] = (
    Rule(
        _unique_host_names,
        f"Host names are unique, and none is `{BASTION}` (the name `via` gives the jump host).",
    ),
    Rule(_unique_fabric_ips, "No two hosts share a `fabricIp`."),
    Rule(
        _via_targets_exist,
        "`hosts[].via` names another host, itself reached directly (one hop), or `bastion`, "
        "which is then set.",
    ),
    Rule(
        _fabric_apart_from_management,
        "A host's `address` is not its own `fabricIp` when SSH reaches it from outside the "
        "cluster (directly or through the bastion), unless `fabric.sharedWithManagement` is "
        "true: the firewall admits whatever arrives on the fabric.",
    ),
    Rule(_one_head, "At most one host has `head: true`."),
    Rule(
        _models_named_once,
        "The models are named once: `model.id` and `vllm.tensorParallelSize` (one model on "
        "every host), or `models`; with `models`, `model` keeps only `cacheDir` and `vllm` only "
        "its stack-wide keys (`port`, `listen`, `serverPort`, `masterPort`, `compileCache`, "
        "`benchmark`, `hostNccl`).",
    ),
    Rule(_model_hosts_exist, "Each of `models[].hosts` names a host, once."),
    Rule(
        _gpus_match_parallelism,
        "A model's `tensorParallelSize` x `pipelineParallelSize` equals the `gpus` its hosts "
        "declare in all.",
    ),
    Rule(
        _executor_places_every_rank,
        "With `executor: mp`, a model's ranks divide evenly over its hosts, and each of them "
        "declares that many `gpus` (mixed GPU counts need `executor: ray`).",
    ),
    Rule(
        _ports_distinct,
        "Every port the stack listens on is its own: `vllm.port`, `vllm.serverPort`, "
        f"`vllm.masterPort` and the {MP_PORT_SPAN} after it (vLLM's message queues; each "
        f"further model takes `serverPort` + k and `masterPort` + {MP_PORT_SPAN + 1}k), "
        "`front.metricsPort`, the monitoring ports and Ray's, outside "
        "`ray.minWorkerPort`..`maxWorkerPort`; and none of them is an SSH port (22, "
        "`hosts[].port`, `bastion.port`), which the firewall would cut.",
    ),
    Rule(
        _no_user_overrides,
        "`env` and `extraArgs` (of `vllm`, or of each `models[]` entry) leave alone what "
        "spark-vllm sets or cannot guard: no variable it derives per node or that moves the "
        "compile caches; no variable or flag that opens a listener the firewall cannot know "
        "(stacks/vllm_listeners.py); no `RAY_*` variable or `--ray-*` flag with executor mp, "
        "no `--nnodes`-like flag with executor ray; no flag spark-vllm sets (`--api-key`, "
        "`--port`, `-tp`, ...) nor `--config`, in any spelling vLLM's parser reads; and no "
        "`--kv-cache-memory-bytes` beside `kvCache`.",
    ),
    Rule(
        _host_nccl_owns_its_variables,
        "With `vllm.hostNccl`, no `env` sets `VLLM_NCCL_SO_PATH` or `LD_PRELOAD` (it points "
        "them at the host's NCCL).",
    ),
    Rule(
        _cache_apart_from_state,
        "`model.cacheDir` and each host's state directory (`hosts[].stateDir`, or "
        "`~/.spark-vllm`) do not hold one another.",
    ),
    Rule(
        _served_names_distinct,
        "Entries that share a `servedName` serve the same `id`, `revision`, `include` and "
        "`exclude` (replicas).",
    ),
    Rule(
        _keys_named_once_for_served_models,
        "Each of `keys` has a name of its own, and the `models` it names are served names of "
        "the stack's models.",
    ),
    Rule(
        _benchmark_fits_the_context,
        "`vllm.benchmark.inputTokens` + `outputTokens` fit every model's `maxModelLen`.",
    ),
    Rule(
        _ray_servers_apart,
        "No two `executor: ray` models share a host: vLLM's Ray executor takes the node's "
        "whole GPU.",
    ),
    Rule(
        _memory_budget_fits,
        "On a host that serves several models, their fixed `gpuMemoryUtilization`s, "
        f"{MIN_AUTO_SHARE} for each `auto` one and {SERVER_OVERHEAD_SHARE} beside each server "
        f"sum to at most {MAX_NODE_SHARE}.",
    ),
    Rule(
        _one_setting_per_image,
        "Entries that name the same image `ref` (or `image.ref`'s) give it the same settings "
        "(`platform`, `keepOnDestroy`, `keepPrevious`).",
    ),
    Rule(
        _placement_deployable,
        "Every host serves some model; with several models, a Ray model's hosts include the head.",
    ),
)


def first_problem(cfg: StackSchema) -> str | None:
    """The first rule's problem, keyed, or None when every rule holds."""
    for rule in RULES:
        problem = rule.check(cfg)
        if problem:
            return problem
    return None
