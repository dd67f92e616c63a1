"""The deployment's graph as data (stacks/plan/graph.py): computed from the config and facts
before any resource, its edges by name, checked here as tables without the Pulumi runtime. The
mocks tests (test_graph.py, the goldens) check that the walk registers exactly this."""

from __future__ import annotations

import functools
import shlex
from typing import Any

import pytest

from stacks.plan import graph as g
from stacks.plan import names
from stacks.plan.containers import ContainerSpec
from stacks.plan.later import consumed
from stacks.plan.steps import StepSpec, create_consumes, delete_consumes
from tests.program.conftest import ConfigFactory
from tests.program.planning import graph_of

SHAPES = [
    pytest.param(hosts, executor, extra, id=f"{hosts}-{executor}-{label}")
    for hosts in (1, 2, 3, 4)
    for executor in ("ray", "mp")
    for label, extra in (
        ("defaults", {}),
        ("trust-existing-no-firewall", {"fabric": {"trust": "existing", "firewall": False}}),
        ("kv-auto", {"vllm": {"kvCache": "auto", "gpuMemoryUtilization": "auto"}}),
    )
]


def configured(
    make_config: ConfigFactory, hosts: int, executor: str, extra: dict[str, Any]
) -> dict[str, Any]:
    config = make_config(hosts=hosts, executor=executor)
    for key, value in extra.items():
        config[key] = {**config.get(key, {}), **value}
    return config


def consumes(entry: g.Planned) -> tuple[str, ...]:
    spec = entry.spec
    if isinstance(spec, StepSpec):
        return (*create_consumes(spec), *delete_consumes(spec))
    if isinstance(spec, ContainerSpec):
        return (*consumed(*spec.command), *((entry.image.name,) if entry.image else ()))
    return ()


def ancestors_in(graph: g.DeploymentGraph, name: str) -> set[str]:
    """Everything `name` runs after, directly or through what it runs after."""
    found: set[str] = set()
    todo = list(graph.by_name[name].after)
    while todo:
        if (edge := todo.pop()) not in found:
            found.add(edge)
            todo += graph.by_name[edge].after
    return found


@pytest.mark.parametrize(("hosts", "executor", "extra"), SHAPES)
def test_every_edge_and_value_comes_from_a_resource_registered_before(
    make_config: ConfigFactory, hosts: int, executor: str, extra: dict[str, Any]
) -> None:
    """One walk in order can register it: everything an entry runs after, whose IDs it
    carries, whose stdout it reads, and every later value's source comes earlier."""
    plan, graph = graph_of(configured(make_config, hosts, executor, extra))
    index = {entry.name: i for i, entry in enumerate(graph)}
    index |= dict.fromkeys(g.REGISTERED_BEFORE, -1)
    sources = g.later_sources(plan)
    for i, entry in enumerate(graph):
        named = [*entry.after, *entry.triggers]
        named += [name for _, names in entry.id_labels for name in names]
        named += [entry.stdout_stdin] if entry.stdout_stdin else []
        named += [sources[value].resource for value in consumes(entry)]
        assert all(index[name] < i for name in named), entry.name
    # Each component's entries are contiguous: the walk builds a component at once.
    components = [entry.component for entry in graph]
    assert len({c for c in components}) == sum(
        1 for a, b in zip(["", *components], components, strict=False) if a != b
    )


@pytest.mark.parametrize(("hosts", "executor", "extra"), SHAPES)
def test_nothing_of_ours_starts_before_its_node_was_checked_and_firewalled(
    make_config: ConfigFactory, hosts: int, executor: str, extra: dict[str, Any]
) -> None:
    """Every Ray and vLLM container runs after (possibly through the cluster it joins) its
    node's preflight, its firewall's rules holding, its image and compile cache, and the memory
    check; the server after every node's weights."""
    plan, graph = graph_of(configured(make_config, hosts, executor, extra))

    ancestors = functools.partial(ancestors_in, graph)

    firewall = plan.config.fabric.firewall
    for entry in graph:
        spec = entry.spec
        if not isinstance(spec, ContainerSpec) or spec.role not in (
            "ray-head",
            "ray-worker",
            "vllm",
            "vllm-headless",
        ):
            continue
        node = entry.node
        needed = {
            names.preflight_of(node),
            names.compile_cache_of(node),
            names.image_facts_of(node),
            names.check_of(names.MEMORY),
            *([names.rules_of(node)] if firewall else []),
        }
        assert needed <= ancestors(entry.name), (entry.name, needed - ancestors(entry.name))
    server_before = ancestors(names.container_of(names.VLLM))
    assert {names.weights_copy_of(names.WEIGHTS, w.name) for w in plan.workers} <= server_before
    assert {names.container_of(names.VLLM), names.FRONT_CONTAINER} <= set(
        graph.by_name[names.ready_of(names.VLLM)].after
    )


def relay_chain(graph: g.DeploymentGraph, step: str) -> str | None:
    """The `--relay` chain a copy step's command carries (image-sync.sh, weights-sync.sh)."""
    spec = graph.by_name[step].spec
    assert isinstance(spec, StepSpec), step
    words = shlex.split(spec.create)
    return words[words.index("--relay") + 1] if "--relay" in words else None


def test_the_first_workers_copies_relay_to_every_worker(make_config: ConfigFactory) -> None:
    """With several workers, the first worker's image and weights steps carry the relay chain
    (every worker in order, `name|destination|bin`) and run once every worker is ready for it
    (its preflight: relay.sh is there; its link test: the chain checks its key); the other
    workers' steps run after it, to find what it brought."""
    plan, graph = graph_of(make_config(hosts=4))
    leader, *others = plan.workers
    for step_of in (
        functools.partial(names.image_sync_of, names.IMAGE),
        functools.partial(names.weights_copy_of, names.WEIGHTS),
    ):
        lead = step_of(leader.name)
        chain = relay_chain(graph, lead)
        assert chain is not None, lead
        members = [line.split("|") for line in chain.splitlines()]
        assert [m[0] for m in members] == [w.name for w in plan.workers]
        assert [m[1] for m in members] == [w.fabric_destination for w in plan.workers]
        assert [m[2] for m in members] == [w.bin_dir for w in plan.workers]
        for worker in plan.workers:
            assert names.preflight_of(worker.name) in ancestors_in(graph, lead)
            assert names.link_of(worker.name) in ancestors_in(graph, lead)
        for worker in others:
            assert relay_chain(graph, step_of(worker.name)) is None
            assert lead in graph.by_name[step_of(worker.name)].after
    # The weights' chain passes every worker: it waits until none is still loading the image.
    lead = names.weights_copy_of(names.WEIGHTS, leader.name)
    for worker in plan.workers:
        assert names.image_facts_of(worker.name) in ancestors_in(graph, lead)


@pytest.mark.parametrize(
    ("hosts", "fabric"), [(2, {}), (4, {"trust": "existing"})], ids=["one-worker", "existing"]
)
def test_no_relay_without_two_workers_and_a_managed_key(
    make_config: ConfigFactory, hosts: int, fabric: dict[str, str]
) -> None:
    """One worker has nothing to relay to; with `fabric.trust: existing` the program has no
    key of its own to forward to the chain's hops, so each worker's step copies on its own."""
    plan, graph = graph_of(make_config(hosts=hosts, **({"fabric": fabric} if fabric else {})))
    leader, *others = plan.workers
    for worker in plan.workers:
        assert relay_chain(graph, names.image_sync_of(names.IMAGE, worker.name)) is None
        assert relay_chain(graph, names.weights_copy_of(names.WEIGHTS, worker.name)) is None
    for worker in others:
        sync = graph.by_name[names.image_sync_of(names.IMAGE, worker.name)]
        assert names.image_sync_of(names.IMAGE, leader.name) not in sync.after


def test_a_graph_that_names_a_later_resource_is_refused(make_config: ConfigFactory) -> None:
    _, graph = graph_of(make_config(hosts=2))
    first, *rest = graph.entries
    with pytest.raises(ValueError, match="not before it"):
        g.DeploymentGraph((*rest, first))
    with pytest.raises(ValueError, match="two resources"):
        g.DeploymentGraph((*graph.entries, graph.entries[-1]))


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_the_server_carries_the_ids_of_the_cluster_it_joined(
    make_config: ConfigFactory, executor: str
) -> None:
    plan, graph = graph_of(make_config(hosts=3, executor=executor))
    labels = dict(graph.by_name[names.container_of(names.VLLM)].id_labels)
    if executor == "ray":
        assert labels == {"spark-vllm.ray-cluster": (names.RAY_JOINED,)}
        assert set(graph.by_name[names.RAY_JOINED].triggers) == {
            names.RAY_HEAD,
            *(names.ray_worker_of(w.name) for w in plan.workers),
        }
    else:
        assert labels == {
            "spark-vllm.mp-nodes": tuple(
                names.headless_of(names.VLLM, w.name) for w in plan.workers
            )
        }


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_a_head_that_is_not_the_first_host(make_config: ConfigFactory, executor: str) -> None:
    """`hosts[1].head: true`: Ray's head is registered before the workers that join it, and
    the graph builds in order for either executor."""
    config = make_config(hosts=3, executor=executor)
    config["hosts"][1]["head"] = True
    plan, graph = graph_of(config)
    assert plan.head.name == "spark2"
    if executor == "ray":
        order = [e.name for e in graph if e.name.startswith("ray-")]
        assert order[0] == "ray-head" and set(order[1:3]) == {"ray-spark1", "ray-spark3"}
    server = graph.by_name["vllm-container"]
    assert server.node == "spark2"
