"""The whole deployment as one data structure, computed from the config and the facts read
before any resource: every resource the program registers, in the order it registers them, with
its spec, the component it belongs to, and its edges by name (what it runs after, which IDs
replace it, whose stdout it reads). The composition (composition/deployment.py) walks it once;
the components only turn each entry into a resource (components/graph.py).

Names here are resource names, and so part of each resource's URN: renaming one is a new
resource to the engine (an alias keeps the old identity: `Planned.moved_from`).

The edges, in one place (each one's reason is beside it below):

    host scripts -> preflight -> fabric key, authorize, pin -> link test (every worker)
    image pull -> record -> worker copies (after every link test) -> image facts (every node)
    weights fetch (after the head's image facts) -> worker copies (after their image facts)
    memory check (after every node's weights)
    firewall guard (after the node's image facts and the memory check) -> its rules hold
    memory guard (after the node's image facts and the memory check)
    front: key file, its config, its image -> its container (after the memory check)
    compile cache (after the node's image facts)
    Ray containers (after their firewall, memory guard, compile cache, memory check) -> join wait
    vLLM (after Ray's join wait, or with mp its headless ranks) -> readiness (through the front)
    each further model (a slot, stacks/fleet.py): its weights (each worker's copy after the
    previous model's), its memory check (after the previous model's readiness), its vLLM
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from stacks.plan import fabric, hardware, hosts, image, monitoring, names, server, weights
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.containers import (
    API_KEY_HASH_LABEL,
    MP_NODES_LABEL,
    RAY_CLUSTER_LABEL,
    RAY_HEAD_ID_LABEL,
    ContainerSpec,
    EntryScripts,
    docker_filter_container,
    firewall_container,
    front_container,
    headless_container,
    memory_guard_container,
    ray_container,
    vllm_container,
)
from stacks.plan.image import ImagePull, ImageStream
from stacks.plan.instance import INSTANCE_ID, instance_token
from stacks.plan.later import (
    FRONT_IMAGE_ID,
    GPU_MEMORY_UTILIZATION,
    IMAGE_ID,
    KV_BLOCK_SIZE,
    KV_CACHE_BYTES,
    PINNED_IMAGE,
    Later,
)
from stacks.plan.server_plan import ServerPlan, per_server
from stacks.plan.sizing import checked_sizing, server_sizing, sizing_values
from stacks.plan.steps import Stdin, StepSpec


@dataclass(frozen=True)
class Source:
    """Where a later value comes from: a resource's output, and what the value is made of it."""

    resource: str
    output: Literal["image_id", "stdout"]
    derive: Callable[[str], str]


# What the composition registers before it walks the graph, and the graph's values may come
# from: the stack instance's token (stacks/plan/instance.py), which every host's claim names.
REGISTERED_BEFORE = (names.INSTANCE_TOKEN,)


def later_sources(plan: ClusterPlan) -> dict[str, Source]:
    """Every later value (stacks/plan/later.py) by name, and its source: each server's manifest
    and sizing come from its own fetch and memory check."""
    manifest, sizing = {}, {}
    for slot in plan.servers:
        fetch = names.fetch_of(names.weights_of(slot))
        check = names.check_of(names.memory_of(slot))
        for later in weights.MANIFEST_FIELDS:
            derive = functools.partial(_manifest_field, later.name)
            manifest[later.of_slot(slot.index).name] = Source(fetch, "stdout", derive)
        for later in (GPU_MEMORY_UTILIZATION, KV_CACHE_BYTES):
            derive = functools.partial(_sizing_field, later.name)
            sizing[later.of_slot(slot.index).name] = Source(check, "stdout", derive)
    images = {}
    for stream in image.image_streams(plan):
        pull = names.image_pull_of(stream.component)
        images[stream.later(IMAGE_ID).name] = Source(pull, "image_id", str)
        pinned = functools.partial(image.pinned_image, key=stream.key)
        images[stream.later(PINNED_IMAGE).name] = Source(pull, "image_id", pinned)
        facts = names.image_facts_of(plan.head.name, stream.component)
        images[stream.later(KV_BLOCK_SIZE).name] = Source(facts, "stdout", image.kv_block_size)
    watched = {
        later.name: Source(names.pull_of(container), "image_id", str)
        for container, _, _, later in monitoring_pulls(plan)
    }
    return {
        INSTANCE_ID.name: Source(names.INSTANCE_TOKEN, "stdout", instance_token),
        **images,
        FRONT_IMAGE_ID.name: Source(names.FRONT_PULL, "image_id", str),
        **watched,
        **manifest,
        **sizing,
    }


def monitoring_pulls(plan: ClusterPlan) -> list[tuple[str, str, ImagePull, Later]]:
    """Monitoring's image pulls (none when it is off): (the container it is for, node, the pull,
    the later value naming the image there; the pull's resource: `names.pull_of(container)`).
    Prometheus and Grafana on the head; each node pulls its own
    exporter (a small image; nothing else there runs it)."""
    cfg = plan.config.monitoring
    if not cfg.enabled:
        return []
    head = plan.head.name
    pulls = [(names.PROMETHEUS, head, monitoring.prometheus_pull(plan))]
    if cfg.grafana.enabled:
        pulls.append((names.GRAFANA, head, monitoring.grafana_pull(plan)))
    if cfg.node_exporter.enabled:
        pulls += [
            (names.node_exporter_of(node.name), node.name, monitoring.node_exporter_pull(plan))
            for node in plan.nodes
        ]
    return [
        (name, node, pull, monitoring.image_later(f"image-{index}"))
        for index, (name, node, pull) in enumerate(pulls)
    ]


def fetched_manifest(stdout: str) -> str:
    """The weights fetch's last line: the snapshot's manifest, "commit files bytes"."""
    return stdout.strip().splitlines()[-1]


def _manifest_field(name: str, stdout: str) -> str:
    return weights.manifest_values(fetched_manifest(stdout))[name]


def _sizing_field(name: str, stdout: str) -> str:
    values = sizing_values(checked_sizing(hardware.parse_memory_sizing(stdout)))
    if name not in values:
        raise ValueError(f"spark-vllm: the memory check chose no {name} (its `memory` output)")
    return values[name]


@dataclass(frozen=True)
class GraphFacts:
    """What the plan needs of this machine and the hosts before any resource: the scripts
    bundle's digest, the containers' entry scripts, and each node's mounts token (the token of
    its bound directories' marks, components/facts.py)."""

    scripts_digest: str
    entry_scripts: EntryScripts
    mounts_tokens: Mapping[str, str]  # by node name


@dataclass(frozen=True)
class MovedFrom:
    """Where a resource was registered before a release moved it: its name, and its parent's
    type and name (a pulumi.Alias)."""

    name: str
    parent_type: str
    parent_name: str


@dataclass(frozen=True)
class Planned:
    """One resource of the deployment."""

    name: str  # its resource name
    component: str  # the component it is registered under (its parent)
    spec: StepSpec | ContainerSpec | ImagePull
    node: str  # whose connection (a step) or Docker daemon (a container, a pull) it uses
    after: tuple[str, ...] = ()  # resources it runs after (depends_on), in order
    triggers: tuple[str, ...] = ()  # a step: resources whose new ID re-runs it (replaced)
    stdout_stdin: str | None = None  # a step: whose stdout it reads on stdin (its spec's kind)
    id_labels: tuple[tuple[str, tuple[str, ...]], ...] = ()  # a container: label -> whose IDs
    secret_labels: tuple[tuple[str, Stdin], ...] = ()  # a container: label -> a secret's hash
    secret_triggers: tuple[Stdin, ...] = ()  # a step: secrets whose new hash re-runs it
    image: Later | None = None  # a container: the later value naming its image
    moved_from: tuple[MovedFrom, ...] = ()


ComponentKind = Literal[
    "host",
    "fabric",
    "image",
    "weights",
    "memory",
    "firewall",
    "memory-guard",
    "front",
    "compile-cache",
    "ray",
    "vllm",
    "monitoring",
]


@dataclass(frozen=True)
class PlannedComponent:
    """One component of the deployment: what it is, and the name its resources are registered
    under (a host's: the host's name)."""

    kind: ComponentKind
    name: str


@dataclass(frozen=True)
class DeploymentGraph:
    entries: tuple[Planned, ...]
    # In registration order: the composition registers them so (their order is the URNs' and
    # the engine's, and each one's resources come after the ones they run after).
    components: tuple[PlannedComponent, ...] = ()
    by_name: dict[str, Planned] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Planned] = {}
        for entry in self.entries:
            if entry.name in by_name:
                raise ValueError(f"spark-vllm: two resources are named {entry.name}")
            missing = [a for a in (*entry.after, *entry.triggers) if a not in by_name]
            if missing:
                raise ValueError(f"spark-vllm: {entry.name} runs after {missing}, not before it")
            by_name[entry.name] = entry
        object.__setattr__(self, "by_name", by_name)
        named = {c.name for c in self.components}
        homeless = sorted({e.component for e in self.entries} - named) if self.components else []
        if homeless:
            raise ValueError(f"spark-vllm: resources under components never planned: {homeless}")

    def of(self, component: str) -> list[Planned]:
        return [entry for entry in self.entries if entry.component == component]

    def __iter__(self) -> Iterator[Planned]:
        return iter(self.entries)


def plan_graph(plan: ClusterPlan, facts: GraphFacts) -> DeploymentGraph:
    """Every resource of the deployment, in registration order."""
    entries: list[Planned] = []
    for node in plan.nodes:
        entries += _host(plan, node, facts)
    links = _fabric(plan, entries)
    synced: dict[str, str] = {}  # by worker: the last image copy to it so far
    every_stream = image.image_streams(plan)
    streams = {s.key: _image(plan, entries, links, s, synced) for s in every_stream}
    image_ready = streams[""]
    servers = per_server(plan)
    # By worker: the last copy to it so far (one transfer per link): the images' first. With
    # image.ref's alone, its check on the worker (image_ready) already comes after its copy.
    copied = dict(synced) if len(every_stream) > 1 else {}
    weights_ready = [_weights(each, entries, image_ready, copied) for each in servers]
    check = _memory(servers[0], entries, weights_ready[0], streams)
    firewalled = _firewall(plan, entries, facts, image_ready, check)
    guarded = _memory_guard(plan, entries, facts, image_ready, check)
    key_file, front, front_reload = _front(plan, entries, facts, check)
    cache_ready = _compile_cache(plan, entries, image_ready)
    gates = _Gates(firewalled, guarded, cache_ready, check, streams)
    # Ray drives one server (vLLM's Ray executor takes each node's whole GPU: StackConfig
    # allows one Ray model, on every host); the others are mp servers beside it.
    driver = next((each for each in servers if each.uses_ray), None)
    joined = _ray(driver, entries, facts, gates) if driver is not None else None
    first_joined = joined if servers[0].uses_ray else None
    # What Ray's containers waited for (a server joining them already comes after it).
    ray_checked = (gates.check,)
    ready = _vllm(
        servers[0],
        entries,
        facts,
        gates,
        weights_ready[0],
        first_joined,
        key_file,
        front,
        front_reload,
        ray_checked,
    )
    # Each further server's memory is checked once the one before it is ready: vLLM measures
    # what a GPU has free when it starts, and two servers starting at once on one GPU would
    # each count the other's memory as free.
    for later_server, fetched in zip(servers[1:], weights_ready[1:], strict=True):
        check = _memory(later_server, entries, (*fetched, ready), streams)
        ready = _vllm(
            later_server,
            entries,
            facts,
            replace(gates, check=check),
            fetched,
            joined if later_server.uses_ray else None,
            key_file,
            front,
            front_reload,
            ray_checked,
        )
    _monitoring(plan, entries, image_ready, firewalled, ready, facts.entry_scripts)
    return DeploymentGraph(tuple(entries), _components(plan, servers, every_stream))


def _host(plan: ClusterPlan, node: NodePlan, facts: GraphFacts) -> list[Planned]:
    scripts = hosts.install_scripts(plan, node, facts.scripts_digest)
    # A new bundle re-runs the preflight: its checks live in the scripts.
    steps = [
        Planned(scripts.name, node.name, scripts, node.name),
        Planned(
            names.preflight_of(node.name),
            node.name,
            hosts.preflight(plan, node),
            node.name,
            after=(scripts.name,),
            triggers=(scripts.name,),
        ),
    ]
    shares = hosts.write_memory_shares(plan) if node.is_head else None
    if shares is not None:
        steps.append(Planned(shares.name, node.name, shares, node.name, after=(scripts.name,)))
    return steps


def _fabric(plan: ClusterPlan, entries: list[Planned]) -> dict[str, str]:
    """The head's access to each worker over the fabric, then each link's test: by worker."""
    head = plan.head
    trusted: dict[str, tuple[str, ...]] = {
        w.name: (names.preflight_of(head.name), names.preflight_of(w.name)) for w in plan.workers
    }
    if fabric.fabric_trust_managed(plan):
        key = fabric.head_fabric_key(plan)
        entries.append(
            Planned(key.name, names.FABRIC, key, head.name, after=(names.preflight_of(head.name),))
        )
        for worker in plan.workers:
            authorize = fabric.authorize_head_key(plan, worker)
            entries.append(
                Planned(
                    authorize.name,
                    names.FABRIC,
                    authorize,
                    worker.name,
                    after=(names.preflight_of(worker.name),),
                    stdout_stdin=key.name,
                )
            )
            # The worker's host key, as its authorize step read it, pinned on the head.
            pin = fabric.pin_worker_key(plan, worker)
            entries.append(
                Planned(
                    pin.name,
                    names.FABRIC,
                    pin,
                    head.name,
                    after=(authorize.name, key.name),
                    stdout_stdin=authorize.name,
                )
            )
            trusted[worker.name] = (pin.name,)
    links: dict[str, str] = {}
    for worker in plan.workers:
        link = hardware.fabric_link(plan, worker)
        after = (*trusted[worker.name], names.scripts_of(worker.name))
        entries.append(Planned(link.name, names.FABRIC, link, head.name, after=after))
        links[worker.name] = link.name
    return links


def _image(
    plan: ClusterPlan,
    entries: list[Planned],
    links: dict[str, str],
    stream: ImageStream,
    copied: dict[str, str],
) -> dict[str, str]:
    """Pulled on the head, copied to the stream's workers once every link was tested (after
    the image copied there before it: one transfer at a time per link, and one stage per image
    on the worker), checked on each of its nodes: by node, the step after which it has the
    image. `copied`: by worker, the last image copy to it so far (updated)."""
    head, component = plan.head, stream.component
    pull = names.image_pull_of(component)
    pulled = image.image_pull(plan, stream)
    entries.append(
        Planned(pull, component, pulled, head.name, after=(names.preflight_of(head.name),))
    )
    record = image.record_image(plan, stream)
    entries.append(Planned(record.name, component, record, head.name, after=(pull,)))

    def ready_for(worker: NodePlan) -> tuple[str, ...]:
        before = (copied[worker.name],) if worker.name in copied else ()
        return (record.name, names.preflight_of(worker.name), *links.values(), *before)

    # Its copies and their relay chain cover its nodes alone.
    synced = {head.name: record.name}
    for worker, spec, after in _head_to_workers(
        plan, stream.workers, lambda w: image.sync_image(plan, w, stream), ready_for
    ):
        entries.append(Planned(spec.name, component, spec, head.name, after=after))
        synced[worker.name] = spec.name
    copied.update({w: step for w, step in synced.items() if w != head.name})
    checked: dict[str, str] = {}
    for node in stream.nodes:
        spec = image.image_facts(plan, node, stream)
        entries.append(Planned(spec.name, component, spec, node.name, after=(synced[node.name],)))
        checked[node.name] = spec.name
    # Then each node's history of images: older ones than image.keepPrevious lose their name.
    for node in stream.nodes:
        spec = image.retain_images(plan, node, stream)
        entries.append(Planned(spec.name, component, spec, node.name, after=(checked[node.name],)))
    return checked


def _weights(
    plan: ServerPlan,
    entries: list[Planned],
    image_ready: dict[str, str],
    copied: dict[str, str],
) -> list[str]:
    """The plan's server's model fetched on the head (which runs the serving image for it),
    copied to every worker: the steps after which each node has the snapshot. `copied`: by
    worker, the last copy to it so far (updated)."""
    head, component = plan.head, names.weights_of(plan.slot)
    fetch = weights.fetch_weights(plan)
    entries.append(
        Planned(fetch.name, component, fetch, head.name, after=(image_ready[head.name],))
    )

    # One transfer at a time per worker: the image's and every model's share its fabric link.
    def ready_for(worker: NodePlan) -> tuple[str, ...]:
        before = (copied[worker.name],) if worker.name in copied else ()
        return (fetch.name, names.scripts_of(worker.name), image_ready[worker.name], *before)

    mine = {}
    for worker, spec, after in _head_to_workers(
        plan.cluster, plan.workers, lambda w: weights.copy_weights(plan, w), ready_for
    ):
        entries.append(Planned(spec.name, component, spec, head.name, after=after))
        mine[worker.name] = spec.name
    copied.update(mine)
    return [fetch.name, *(mine[w.name] for w in plan.workers)]


def _head_to_workers(
    plan: ClusterPlan,
    workers: tuple[NodePlan, ...],
    spec_for: Callable[[NodePlan], StepSpec],
    ready_for: Callable[[NodePlan], tuple[str, ...]],
) -> list[tuple[NodePlan, StepSpec, tuple[str, ...]]]:
    """A step the head runs for each of `workers`, in registration order, with what it runs after.

    With a relay leader (stacks/plan/fabric.py relay_leader), the leader's step relays to every
    worker: it runs once every worker is ready for it, and the other workers' steps run after
    it, to find what it brought (or copy what its chain could not)."""
    leader = fabric.relay_leader(plan, workers)
    if leader is None:
        return [(w, spec_for(w), ready_for(w)) for w in workers]
    others = [w for w in workers if w.name != leader.name]
    relayed = spec_for(leader)
    every_ready = tuple(name for w in others for name in ready_for(w))
    return [
        (leader, relayed, (*ready_for(leader), *every_ready)),
        *((w, spec_for(w), (*ready_for(w), relayed.name)) for w in others),
    ]


def _memory(
    plan: ServerPlan,
    entries: list[Planned],
    after: Sequence[str],
    images: dict[str, dict[str, str]],
) -> str:
    """Measured on every node once the image and the weights are there, before the plan's
    server starts (the first server's: before anything of ours starts); beside others once
    the fleet's shares are on the head. A server on an image of its own: once that image is
    on its nodes too (the probe runs it there for CUDA's figure)."""
    component = names.memory_of(plan.slot)
    check = hardware.memory_check(plan)
    shares = (names.shares_of(plan.head.name),) if len(plan.cluster.servers) > 1 else ()
    key = plan.image_stream.key
    own = tuple(images[key][n.name] for n in plan.nodes) if key else ()
    entries.append(
        Planned(check.name, component, check, plan.head.name, after=(*after, *shares, *own))
    )
    return check.name


def _firewall(
    plan: ClusterPlan,
    entries: list[Planned],
    facts: GraphFacts,
    image_ready: dict[str, str],
    check: str,
) -> dict[str, str]:
    """A guard container per node (from the serving image), then a step that waits until its
    rules hold: by node, that step (none with the firewall off)."""
    ready: dict[str, str] = {}
    for node in plan.nodes:
        step = hosts.firewall(plan, node)
        if step is None:
            continue
        guard = firewall_container(plan, node, facts.mounts_tokens[node.name], facts.entry_scripts)
        guard_name = names.guard_of(node.name)
        entries.append(
            Planned(
                guard_name,
                names.FIREWALL,
                guard,
                node.name,
                after=(names.preflight_of(node.name), image_ready[node.name], check),
                image=PINNED_IMAGE,
            )
        )
        # Not replaced with its guard (a new image replaces the guard): the old step's delete
        # would take the rules down after the new one waited. A new guard's rules are awaited
        # by the gate of every container that starts after it.
        entries.append(Planned(step.name, names.FIREWALL, step, node.name, after=(guard_name,)))
        ready[node.name] = step.name
    return ready


def _memory_guard(
    plan: ClusterPlan,
    entries: list[Planned],
    facts: GraphFacts,
    image_ready: dict[str, str],
    check: str,
) -> dict[str, str]:
    """memoryGuard: a guard container per node (from the serving image), started before the
    node's Ray and vLLM containers (and deleted after them), and, as the firewall's guard,
    after the memory check (a refusal starts nothing): by node (none when it is off)."""
    if not plan.guards_memory:
        return {}
    started: dict[str, str] = {}
    for node in plan.nodes:
        # The guard's Docker socket first (the guard's calls fail until it listens).
        docker_filter = names.docker_filter_of(node.name)
        entries.append(
            Planned(
                docker_filter,
                names.MEMORY_GUARD,
                docker_filter_container(plan, node, facts.entry_scripts),
                node.name,
                after=(names.preflight_of(node.name), image_ready[node.name], check),
                image=PINNED_IMAGE,
            )
        )
        name = names.memory_guard_of(node.name)
        entries.append(
            Planned(
                name,
                names.MEMORY_GUARD,
                memory_guard_container(plan, node, facts.entry_scripts),
                node.name,
                after=(names.preflight_of(node.name), image_ready[node.name], check, docker_filter),
                image=PINNED_IMAGE,
            )
        )
        started[node.name] = name
    return started


def _front(
    plan: ClusterPlan, entries: list[Planned], facts: GraphFacts, check: str
) -> tuple[str, str, str]:
    """HAProxy on the head, publishing vllm.port to requests carrying the key: its key file, its
    container and its reload."""
    head = plan.head
    key_file = server.front_key_file(plan)
    # Stacks deployed when the server's component held it keep the same step (an alias), not a
    # new one whose predecessor's delete would remove the key after it was written.
    moved = MovedFrom("vllm-api-key", "spark-vllm:index:VllmServer", names.VLLM)
    entries.append(
        Planned(
            key_file.name,
            names.FRONT,
            key_file,
            head.name,
            after=(names.scripts_of(head.name),),
            moved_from=(moved,),
        )
    )
    config = hosts.write_front_config(plan)
    entries.append(
        Planned(config.name, names.FRONT, config, head.name, after=(names.scripts_of(head.name),))
    )
    keys = server.front_keys_file(plan)
    if keys is not None:
        entries.append(
            Planned(keys.name, names.FRONT, keys, head.name, after=(names.scripts_of(head.name),))
        )
    tls = server.front_tls_file(plan)
    if tls is not None:
        entries.append(
            Planned(tls.name, names.FRONT, tls, head.name, after=(names.scripts_of(head.name),))
        )
    read = (key_file.name, *(step.name for step in (keys, tls) if step is not None))
    pull = names.FRONT_PULL
    entries.append(
        Planned(
            pull,
            names.FRONT,
            image.front_image_pull(plan),
            head.name,
            after=(names.preflight_of(head.name),),
        )
    )
    container = names.FRONT_CONTAINER
    entries.append(
        Planned(
            container,
            names.FRONT,
            front_container(plan, facts.mounts_tokens[head.name]),
            head.name,
            after=(names.preflight_of(head.name), config.name, *read, check),
            # A new key must restart the front (it loads the pattern file at start).
            secret_labels=((API_KEY_HASH_LABEL, "api-key"),),
            image=FRONT_IMAGE_ID,
        )
    )
    reload = hosts.reload_front(plan)
    entries.append(
        Planned(
            reload.name,
            names.FRONT,
            reload,
            head.name,
            after=(config.name, container, *read[1:]),
            # A key added, changed or revoked: the map's hash changes, so the front reloads
            # (the configuration alone names the keys, not their values).
            # So does a new certificate of the user's (front.tls): the front reads it only when
            # it loads its configuration.
            secret_triggers=(
                *(("user-keys",) if keys is not None else ()),
                *(("front-tls",) if plan.config.front.tls.user_certificate else ()),
            ),
        )
    )
    return key_file.name, container, reload.name


def _monitoring(
    plan: ClusterPlan,
    entries: list[Planned],
    image_ready: dict[str, str],
    firewalled: dict[str, str],
    ready: str,
    scripts: EntryScripts,
) -> None:
    """monitoring.enabled: its files and data directory on the head, its pulls, Prometheus and
    Grafana on the head, an exporter on each node (after the node's rules hold: its port is the
    guard's), then a wait until every target is up. Nothing else runs after any of them: turning
    monitoring on or off plans nothing outside this component."""
    pulls = monitoring_pulls(plan)
    if not pulls:
        return
    head = plan.head.name
    files = monitoring.write_files(plan)
    entries.append(
        Planned(files.name, names.MONITORING, files, head, after=(names.scripts_of(head),))
    )
    # After the head's image: its delete empties the directory from that image.
    data = monitoring.prometheus_data(plan)
    entries.append(
        Planned(
            data.name,
            names.MONITORING,
            data,
            head,
            after=(names.scripts_of(head), image_ready[head]),
        )
    )
    image_of: dict[str, Later] = {}
    for container, puller, pull, later in pulls:
        name, after = names.pull_of(container), (names.preflight_of(puller),)
        entries.append(Planned(name, names.MONITORING, pull, puller, after=after))
        image_of[container] = later
    containers = []
    for node in plan.nodes if plan.config.monitoring.node_exporter.enabled else ():
        exporter = names.node_exporter_of(node.name)
        rules = (firewalled[node.name],) if node.name in firewalled else ()
        entries.append(
            Planned(
                exporter,
                names.MONITORING,
                monitoring.node_exporter_container(plan, node, scripts),
                node.name,
                after=(names.pull_of(exporter), *rules),
                image=image_of[exporter],
            )
        )
        containers.append(exporter)
    entries.append(
        Planned(
            names.PROMETHEUS,
            names.MONITORING,
            monitoring.prometheus_container(plan),
            head,
            after=(names.pull_of(names.PROMETHEUS), files.name, data.name),
            image=image_of[names.PROMETHEUS],
        )
    )
    containers.append(names.PROMETHEUS)
    if plan.config.monitoring.grafana.enabled:
        password = monitoring.grafana_password(plan)
        entries.append(
            Planned(
                password.name, names.MONITORING, password, head, after=(names.scripts_of(head),)
            )
        )
        entries.append(
            Planned(
                names.GRAFANA,
                names.MONITORING,
                monitoring.grafana_container(plan),
                head,
                after=(names.pull_of(names.GRAFANA), files.name, password.name),
                # `admin`'s password is set when Grafana first starts (its database is in the
                # container): a password step made again makes a new Grafana.
                id_labels=((monitoring.GRAFANA_PASSWORD_LABEL, (password.name,)),),
                image=image_of[names.GRAFANA],
            )
        )
        containers.append(names.GRAFANA)
    found: tuple[str, ...] = ()
    probe = monitoring.ray_targets(plan)
    if probe is not None:
        # Once Ray's nodes joined; again for a new cluster (its nodes may export otherwise).
        entries.append(
            Planned(
                probe.name,
                names.MONITORING,
                probe,
                head,
                after=(files.name, names.RAY_JOINED),
                triggers=(names.RAY_JOINED,),
            )
        )
        found = (probe.name,)
    wait = monitoring.monitoring_ready(plan)
    # After the last server is ready (its /metrics answers); again whenever a container is new.
    entries.append(
        Planned(
            wait.name,
            names.MONITORING,
            wait,
            head,
            after=(*containers, *found, ready),
            triggers=tuple(containers),
        )
    )


def _compile_cache(
    plan: ClusterPlan, entries: list[Planned], image_ready: dict[str, str]
) -> dict[str, str]:
    """Each node's compile caches, after its image: its Ray and vLLM containers start after
    it, so a destroy deletes them first and the image last. By node."""
    ready: dict[str, str] = {}
    for node in plan.nodes:
        spec = image.compile_cache(plan, node)
        entries.append(
            Planned(
                spec.name, names.COMPILE_CACHE, spec, node.name, after=(image_ready[node.name],)
            )
        )
        ready[node.name] = spec.name
    return ready


@dataclass(frozen=True)
class _Gates:
    """What every Ray and vLLM container of a node starts after: its preflight, its rules
    holding (by node; none with the firewall off), its memory guard (by node; none when off),
    its image and compile cache (by node), and the memory check."""

    firewalled: dict[str, str]
    guarded: dict[str, str]
    cache_ready: dict[str, str]
    check: str
    images: dict[str, dict[str, str]]  # by image stream (its key), by node: checked there

    def of(self, node: NodePlan, stream: str = "") -> tuple[str, ...]:
        """`stream`: the image the container runs (image.ref's comes before the cache)."""
        rules = (self.firewalled[node.name],) if node.name in self.firewalled else ()
        guard = (self.guarded[node.name],) if node.name in self.guarded else ()
        own = (self.images[stream][node.name],) if stream else ()
        return (
            names.preflight_of(node.name),
            *rules,
            *guard,
            self.cache_ready[node.name],
            *own,
            self.check,
        )


def _ray(plan: ServerPlan, entries: list[Planned], facts: GraphFacts, gates: _Gates) -> str:
    """A container per node with Ray as its main process, then a bounded join wait (`plan`:
    the Ray model's server's, whose firewall marker the containers' gate reads)."""
    started = []
    # The head first: the workers join it (and carry its ID), wherever it is in hosts.
    for node in sorted(plan.nodes, key=lambda n: not n.is_head):
        spec = ray_container(plan, node, facts.mounts_tokens[node.name], facts.entry_scripts)
        name = names.RAY_HEAD if node.is_head else names.ray_worker_of(node.name)
        after = gates.of(node, plan.image_stream.key)
        head_name = names.RAY_HEAD
        entries.append(
            Planned(
                name,
                names.RAY,
                spec,
                node.name,
                after=after if node.is_head else (*after, head_name),
                # Workers joined this head: a replaced head must replace them too.
                id_labels=() if node.is_head else ((RAY_HEAD_ID_LABEL, (head_name,)),),
                image=plan.pinned_image,
            )
        )
        started.append(name)
    wait = server.ray_wait(plan)
    # A replaced container means a new cluster: wait for it again.
    entries.append(
        Planned(
            wait.name,
            names.RAY,
            wait,
            plan.head.name,
            after=tuple(started),
            triggers=tuple(started),
        )
    )
    return wait.name


def _vllm(
    plan: ServerPlan,
    entries: list[Planned],
    facts: GraphFacts,
    gates: _Gates,
    weights_ready: list[str],
    joined: str | None,
    key_file: str,
    front: str,
    front_reload: str,
    ray_checked: tuple[str, ...] = (),
) -> str:
    """The plan's server on its node (joined to Ray, or with mp to a headless vLLM on each of
    its other hosts), then its readiness wait, through the front (its name: returned). A
    server on a worker gets the key file there."""
    node, sizing = plan.server_node, server_sizing(plan)
    component = names.vllm_of(plan.slot)
    if not node.is_head:
        own_key = server.server_key_file(plan)
        scripts = (names.scripts_of(node.name),)
        entries.append(Planned(own_key.name, component, own_key, node.name, after=scripts))
        key_file = own_key.name
    # mp: each worker's ranks first; they wait (bounded) for the head's rendezvous. The server
    # then joins them, and carries their IDs: a replaced worker replaces the server too
    # (deleted first, as a delete-before-replace base takes its dependents down), so a new
    # worker always meets a new server, never one that already formed its group. A replaced
    # server alone does not replace them: they rejoin the next one by themselves (their
    # launcher restarts them when the rendezvous they joined is gone).
    headless: list[str] = []
    for worker in plan.ranks[1:] if joined is None else []:
        name = names.headless_of(component, worker.name)
        spec = headless_container(
            plan, worker, facts.mounts_tokens[worker.name], facts.entry_scripts, sizing
        )
        after = (*gates.of(worker, plan.image_stream.key), *weights_ready)
        entries.append(
            Planned(name, component, spec, worker.name, after=after, image=plan.pinned_image)
        )
        headless.append(name)
    cluster = (joined,) if joined is not None else tuple(headless)
    # With Ray, what the head's containers start after comes before the cluster it joins.
    started = () if joined is not None else gates.of(node, plan.image_stream.key)
    if joined is not None and gates.check not in ray_checked:
        # Ray's containers waited for another server's check: this one waits for its own.
        started = (gates.check,)
    container = names.container_of(component)
    entries.append(
        Planned(
            container,
            component,
            vllm_container(plan, facts.mounts_tokens[node.name], facts.entry_scripts, sizing),
            node.name,
            after=(*started, *cluster, key_file, *weights_ready),
            # The cluster it joined: any Ray container replaced (a new head, or a worker
            # recreated after a refresh found it gone) replaces the wait, and the server; with
            # mp, the headless containers it meets.
            id_labels=((RAY_CLUSTER_LABEL if joined is not None else MP_NODES_LABEL, cluster),),
            # A new key must restart vLLM; only its hash (still a secret) is in the config.
            secret_labels=((API_KEY_HASH_LABEL, "api-key"),),
            image=plan.pinned_image,
        )
    )
    containers = (container, *headless, front)
    ready = server.vllm_ready(plan)
    entries.append(
        # After the front's reload too: the wait probes what the front serves now.
        Planned(
            ready.name,
            component,
            ready,
            ready.node.name,
            after=(*containers, front_reload),
            triggers=containers,
        )
    )
    benchmark = server.vllm_benchmark(plan)
    if benchmark is not None:
        # A new server is measured again.
        entry = Planned(
            benchmark.name,
            component,
            benchmark,
            benchmark.node.name,
            after=(ready.name,),
            triggers=(container,),
        )
        entries.append(entry)
    return ready.name


def _components(
    plan: ClusterPlan, servers: Sequence[ServerPlan], streams: Sequence[ImageStream]
) -> tuple[PlannedComponent, ...]:
    """Every component, in the order the composition registers them: the hosts, the fabric, the
    images, each server's weights, the first server's memory check, the firewall, the memory
    guard, the front, the compile caches, Ray (when a server drives it), the first server, then
    each further server's memory check and server, and monitoring (when on). A component
    without resources (the fabric of one host, the firewall or the memory guard when off) is
    still registered: its URN stays the parent of what a later change adds under it."""
    first, *others = servers
    components = [PlannedComponent("host", node.name) for node in plan.nodes]
    components.append(PlannedComponent("fabric", names.FABRIC))
    components += [PlannedComponent("image", stream.component) for stream in streams]
    components += [PlannedComponent("weights", names.weights_of(s.slot)) for s in servers]
    components += [
        PlannedComponent("memory", names.memory_of(first.slot)),
        PlannedComponent("firewall", names.FIREWALL),
        PlannedComponent("memory-guard", names.MEMORY_GUARD),
        PlannedComponent("front", names.FRONT),
        PlannedComponent("compile-cache", names.COMPILE_CACHE),
    ]
    if plan.runs_ray:
        components.append(PlannedComponent("ray", names.RAY))
    components.append(PlannedComponent("vllm", names.vllm_of(first.slot)))
    for other in others:
        components.append(PlannedComponent("memory", names.memory_of(other.slot)))
        components.append(PlannedComponent("vllm", names.vllm_of(other.slot)))
    if plan.config.monitoring.enabled:
        components.append(PlannedComponent("monitoring", names.MONITORING))
    return tuple(components)
