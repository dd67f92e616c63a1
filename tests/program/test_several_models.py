"""Several models on one cluster (stacks/fleet.py ServerSlot): each server's resources, ports,
containers and firewall marker are its slot's; the front routes them all. `pulumi preview` on
a deployed fleet: adding, removing, changing or switching one model plans nothing of the
others (tests/engine/diff.py plans as the engine and the providers do)."""

from __future__ import annotations

import copy
import shlex
from dataclasses import replace

import pytest

from stacks.config import ImageConfig, ServerSettings, parse_stack_config
from stacks.fleet import ServedModel, assign_slots
from stacks.plan import graph as g
from stacks.plan import hardware, names
from stacks.plan.cluster import placed, plan_cluster
from stacks.plan.containers import ContainerSpec
from stacks.plan.front import front_config
from stacks.plan.hosts import write_front_config
from stacks.plan.image import image_streams
from stacks.plan.steps import StepSpec
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate
from tests.program.planning import NAMES, as_models, fleet, graph_of
from tests.program.previews import changes, up_then_preview


def flags(words: tuple[str, ...] | list[str], flag: str) -> list[str]:
    """Every value of `flag` in `words`."""
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]


def slot(base: str, index: int) -> str:
    return base if index == 0 else f"{base}-s{index}"


@pytest.mark.parametrize("hosts", [2, 4])
def test_each_model_gets_its_own_server_ports_and_checks(
    make_config: ConfigFactory, hosts: int
) -> None:
    plan, graph = graph_of(fleet(make_config, hosts))
    workers = [f"spark{i}" for i in range(2, hosts + 1)]
    for index, name in enumerate(NAMES):
        weights, memory, vllm = slot("weights", index), slot("memory", index), slot("vllm", index)
        expected = {
            f"{weights}-fetch",
            *(f"{weights}-{w}-copy" for w in workers),
            f"{memory}-check",
            *(f"{vllm}-{w}" for w in workers),
            f"{vllm}-container",
            f"{vllm}-ready",
        }
        assert expected <= set(graph.by_name), name
        server = graph.by_name[f"{vllm}-container"].spec
        assert isinstance(server, ContainerSpec)
        assert server.name == slot("spark-vllm-vllm", index) or server.name.endswith(
            slot("-vllm", index)
        )
        assert flags(server.command, "--served-model-name") == [name]
        assert flags(server.command, "--port") == [str(8001 + index)]
        assert flags(server.command, "--master-port") == [str(29501 + 33 * index)]
        assert f"VLLM_PORT={29502 + 33 * index}" in server.env
        for worker in workers:  # every rank of this server meets at its own rendezvous
            headless = graph.by_name[f"{vllm}-{worker}"].spec
            assert isinstance(headless, ContainerSpec)
            assert headless.name == server.name
            assert flags(headless.command, "--master-port") == [str(29501 + 33 * index)]
    # No Ray, one front, one guard per node.
    assert not [e for e in graph if e.component == names.RAY]
    assert (
        len([e for e in graph if e.name.startswith("firewall-") and e.name.endswith("-guard")])
        == hosts
    )
    # The front routes each model to its own server.
    config = front_config(plan)
    for index, name in enumerate(NAMES):
        assert f"127.0.0.1:{8001 + index}" in config
        assert name in config


def test_each_server_starts_once_the_one_before_it_is_ready(make_config: ConfigFactory) -> None:
    """A server's memory check runs once the previous server answered (vLLM measures what is
    free when it starts); the copies to one worker run one after another (one link)."""
    _, graph = graph_of(fleet(make_config, 2))
    assert "vllm-ready" in graph.by_name["memory-s1-check"].after
    assert "vllm-s1-ready" in graph.by_name["memory-s2-check"].after
    assert "memory-s1-check" in graph.by_name["vllm-s1-container"].after
    assert "memory-s1-check" in graph.by_name["vllm-s1-spark2"].after
    assert "weights-spark2-copy" in graph.by_name["weights-s1-spark2-copy"].after
    assert "weights-s1-spark2-copy" in graph.by_name["weights-s2-spark2-copy"].after
    # Every readiness wait probes through the front, after its reload.
    for name in ("vllm-ready", "vllm-s1-ready", "vllm-s2-ready"):
        assert {"front-container", "front-reload"} <= set(graph.by_name[name].after)


def test_the_guard_keeps_a_marker_per_server_and_each_gate_reads_its_own(
    make_config: ConfigFactory,
) -> None:
    _, graph = graph_of(fleet(make_config, 2))
    guard = graph.by_name["firewall-spark2-guard"].spec
    wait = graph.by_name["firewall-spark2"].spec
    assert isinstance(guard, ContainerSpec) and isinstance(wait, StepSpec)
    markers = dict(m.split("=") for m in flags(guard.command, "--markers")[0].split(","))
    markers["applied"] = flags(guard.command, "--digest")[0]
    assert set(markers) == {"applied", "applied-s1", "applied-s2"}
    ports = flags(guard.command, "--tcp-ports")[0].split(",")
    for index in range(3):  # every server's message queues are guarded
        first = 29502 + 33 * index
        assert f"{first}:{first + 31}" in ports
        headless = graph.by_name[f"{slot('vllm', index)}-spark2"].spec
        assert isinstance(headless, ContainerSpec)
        gate = headless.entrypoint[headless.entrypoint.index("firewall-gate") + 1 :]
        marker, digest = gate[0], gate[1]
        assert marker.endswith("/" + slot("applied", index))
        assert markers[slot("applied", index)] == digest
    # The firewall step waits for slot 0's marker, as with one model.
    assert flags(shlex.split(wait.create), "--digest") == [markers["applied"]]


def test_the_head_records_each_servers_slot_and_the_models_list(
    make_config: ConfigFactory,
) -> None:
    _, graph = graph_of(fleet(make_config, 2))
    create = graph.by_name["front-config"].spec
    assert isinstance(create, StepSpec)
    words = shlex.split(create.create)
    written = {words[i + 4]: words[i + 2] for i, w in enumerate(words[:-4]) if w == "printf"}
    record = next(text for path, text in written.items() if path.endswith("/front/slots.tmp"))
    assert record == "0 qwen\n1 embed\n2 coder\n"
    models = next(text for path, text in written.items() if path.endswith("/models.json.tmp"))
    assert [m in models for m in NAMES] == [True] * 3


# Every change to the fleet rewrites the routes (and the head's record) and reloads the front;
# a server added or removed changes the ports the guards keep (their rules stay in the kernel
# meanwhile, nothing that serves restarts) and the ports and names preflight checks.
ROUTES = {"front-config": "update", "front-reload": "update"}
# The fleet's memory shares on the head (each memory check reads the servers after its own):
# rewritten when a server comes, goes or changes its share, name or hosts.
SHARES = {"spark1-shares": "update"}
PORTS = {
    "firewall-spark1-guard": "replace",
    "firewall-spark2-guard": "replace",
    "spark1-preflight": "update",
    "spark2-preflight": "update",
}


def test_adding_a_model_creates_only_its_own(make_config: ConfigFactory) -> None:
    before, after = fleet(make_config, 2, NAMES[:2]), fleet(make_config, 2)
    planned, deleted = up_then_preview(before, after)
    created = {n for n, step in planned.items() if step == "create"}
    assert created == {
        "weights-s2-fetch",
        "weights-s2-spark2-copy",
        "memory-s2-check",
        "vllm-s2-spark2",
        "vllm-s2-container",
        "vllm-s2-ready",
    }
    assert {n: s for n, s in planned.items() if s != "create"} == {**ROUTES, **PORTS, **SHARES}
    assert deleted == []


def test_removing_a_model_deletes_only_its_own_and_the_others_keep_their_slots(
    make_config: ConfigFactory,
) -> None:
    before = fleet(make_config, 2)
    after = fleet(make_config, 2, ("qwen", "coder"))  # embed (slot 1) goes
    planned, deleted = up_then_preview(before, after)
    assert planned == {
        **ROUTES,
        **PORTS,
        **SHARES,
        **{n: "delete" for n in planned if planned[n] == "delete"},
    }
    assert sorted(deleted) == sorted(
        [
            "weights-s1-fetch",
            "weights-s1-spark2-copy",
            "memory-s1-check",
            "vllm-s1-spark2",
            "vllm-s1-container",
            "vllm-s1-ready",
        ]
    )


def test_changing_one_models_flags_replaces_only_its_server(make_config: ConfigFactory) -> None:
    before = fleet(make_config, 2)
    after = copy.deepcopy(before)
    after["models"][1]["maxModelLen"] = 8192
    planned, deleted = up_then_preview(before, after)
    assert planned == {
        "vllm-s1-container": "replace",
        "vllm-s1-spark2": "replace",
        "vllm-s1-ready": "replace",
        **ROUTES,  # /v1/models shows its new context length
    }
    assert deleted == []


def test_switching_one_model_for_another_keeps_its_slot(make_config: ConfigFactory) -> None:
    """Its fixed-name containers are replaced, deleted first: its memory is free before the
    new model's server starts. Nothing of the others changes."""
    before = fleet(make_config, 2)
    after = copy.deepcopy(before)
    after["models"][1].update({"id": "org/other", "servedName": "other"})
    up = evaluate(before, SECRETS)
    preview = evaluate(after, SECRETS, preview=True, prior=up)
    planned = changes(preview)
    assert planned == {
        "weights-s1-fetch": "update",
        "weights-s1-spark2-copy": "update",
        "vllm-s1-container": "replace",
        "vllm-s1-spark2": "replace",
        "vllm-s1-ready": "replace",
        **ROUTES,
        **SHARES,
    }
    replaced = [
        r for r in preview.registrations if r.name in ("vllm-s1-container", "vllm-s1-spark2")
    ]
    assert replaced and all(r.delete_before_replace for r in replaced)


def test_a_second_model_leaves_the_first_as_it_was(make_config: ConfigFactory) -> None:
    """An existing stack of one model gains a second: the first keeps slot 0, its names and
    ports; nothing of it changes."""
    before = make_config(hosts=2, executor="mp", vllm={"tensorParallelSize": 2,
                                                       "maxModelLen": 32768, "executor": "mp",
                                                       "gpuMemoryUtilization": 0.5})  # fmt: skip
    after = as_models(before, {"id": "org/embed", "servedName": "embed", "tensorParallelSize": 2,
                               "gpuMemoryUtilization": 0.3})  # fmt: skip
    planned, deleted = up_then_preview(before, after)
    untouched = [n for n in planned if not n.startswith(("weights-s1", "memory-s1", "vllm-s1"))]
    # The shares are new: one model became two.
    assert {n: planned[n] for n in untouched} == {**ROUTES, **PORTS, "spark1-shares": "create"}
    assert deleted == []


def test_a_model_added_first_in_the_list_takes_a_free_slot(make_config: ConfigFactory) -> None:
    """The slots the head recorded hold: a new entry written first moves no other model."""
    before = fleet(make_config, 2, NAMES[:2])
    after = fleet(make_config, 2, ("coder", *NAMES[:2]))
    planned, deleted = up_then_preview(before, after)
    created = sorted(n for n, step in planned.items() if step == "create")
    assert created and all(n.startswith(("weights-s2", "memory-s2", "vllm-s2")) for n in created)
    assert {n: s for n, s in planned.items() if s != "create"} == {**ROUTES, **PORTS, **SHARES}
    assert deleted == []


def served_as(name: str) -> ServedModel:
    """A model as slots see it: its served name and hosts (the rest is not read)."""
    settings = ServerSettings.model_validate({"tensorParallelSize": 1})
    image = ImageConfig.model_validate({"ref": "example/vllm:1"})
    return ServedModel("m", "m", f"org/{name}", "main", name, ("spark1",), settings, image)


SLOTS = [
    # (fleet in order, the head's record, the slots the fleet gets)
    (["a"], {}, [0]),  # one model, as every stack before: slot 0
    (["a", "b", "c"], {}, [0, 1, 2]),  # no record yet: the order written
    (["c", "a", "b"], {"a": 0, "b": 1}, [2, 0, 1]),  # a new entry first takes a free slot
    (["a", "c"], {"a": 0, "b": 1, "c": 2}, [0, 2]),  # b removed: c keeps 2
    (["a", "c", "d"], {"a": 0, "c": 2}, [0, 2, 1]),  # then d takes the lowest free one
    (["a", "x"], {"a": 0, "b": 1}, [0, 1]),  # b switched for x: x takes b's slot
    (["x", "y", "a"], {"a": 0, "b": 1}, [1, 2, 0]),  # a freed slot first, then a new one
    (["b", "d"], {"b": 1, "c": 2}, [1, 2]),  # c switched for d: its slot, not the lower 0
]


@pytest.mark.parametrize(("names", "recorded", "expected"), SLOTS)
def test_slots_stay_where_the_head_recorded_them(
    names: list[str], recorded: dict[str, int], expected: list[int]
) -> None:
    fleet_models = [served_as(n) for n in names]
    assert [s.index for s in assign_slots(fleet_models, recorded)] == expected


def test_replicas_are_recorded_by_name_and_hosts() -> None:
    replicas = [served_as("e"), replace(served_as("e"), hosts=("spark2", "spark1"))]
    slots = assign_slots([served_as("a"), *replicas], {"a": 0, "e@spark1": 2})
    assert [(s.index, s.record_key) for s in slots] == [
        (0, "a"),
        (2, "e@spark1"),
        (1, "e@spark1,spark2"),
    ]


def beside_on_the_head(make_config: ConfigFactory, hosts: int) -> dict:
    """A big model across every host and a small one on the head alone."""
    config = fleet(make_config, hosts, ("qwen",))
    config["models"][0]["gpuMemoryUtilization"] = 0.5
    config["models"].append(
        {"id": "org/embed", "servedName": "embed", "hosts": ["spark1"], "tensorParallelSize": 1,
         "gpuMemoryUtilization": 0.2}
    )  # fmt: skip
    return config


@pytest.mark.parametrize("hosts", [2, 4])
def test_a_model_on_the_head_alone_runs_nothing_on_the_workers(
    make_config: ConfigFactory, hosts: int
) -> None:
    plan, graph = graph_of(beside_on_the_head(make_config, hosts))
    mine = sorted(e.name for e in graph if e.component.endswith("-s1"))
    assert mine == ["memory-s1-check", "vllm-s1-container", "vllm-s1-ready", "weights-s1-fetch"]
    server = graph.by_name["vllm-s1-container"].spec
    assert isinstance(server, ContainerSpec) and server.node.name == "spark1"
    assert flags(server.command, "--nnodes") == ["1"]
    assert flags(server.command, "--expect-ips") == ["10.241.0.11"]
    assert flags(server.command, "--gpus") == ["1"]
    assert "--peers" in server.command and flags(server.command, "--peers") == [""]
    check = graph.by_name["memory-s1-check"].spec
    assert isinstance(check, StepSpec)
    assert "spark2" not in flags(shlex.split(check.create), "--nodes")[0]
    # The workers keep no port, marker or container name of it.
    for worker in (f"spark{i}" for i in range(2, hosts + 1)):
        guard = graph.by_name[f"firewall-{worker}-guard"].spec
        assert isinstance(guard, ContainerSpec)
        assert "--markers" not in guard.command
        assert "29535:29566" not in flags(guard.command, "--tcp-ports")[0]
    head_guard = graph.by_name["firewall-spark1-guard"].spec
    assert isinstance(head_guard, ContainerSpec)
    assert "29535:29566" in flags(head_guard.command, "--tcp-ports")[0].split(",")
    assert "127.0.0.1:8002" in front_config(plan)


def test_adding_a_model_on_the_head_leaves_the_workers_as_they_were(
    make_config: ConfigFactory,
) -> None:
    before = fleet(make_config, 2, ("qwen",))
    before["models"][0]["gpuMemoryUtilization"] = 0.5
    planned, deleted = up_then_preview(before, beside_on_the_head(make_config, 2))
    assert planned == {
        "weights-s1-fetch": "create",
        "memory-s1-check": "create",
        "vllm-s1-container": "create",
        "vllm-s1-ready": "create",
        **ROUTES,
        "spark1-shares": "create",
        "firewall-spark1-guard": "replace",  # the head's ports
        "spark1-preflight": "update",
        # One model became two: each server's memory check replaces preflight's fraction.
        "spark2-preflight": "update",
    }
    assert deleted == []


def replicas(make_config: ConfigFactory) -> dict:
    """One model on each host alone, under one served name: two replicas."""
    config = fleet(make_config, 2, ("embed",))
    first = {**config["models"][0], "tensorParallelSize": 1, "gpuMemoryUtilization": 0.3}
    config["models"] = [{**first, "hosts": ["spark1"]}, {**first, "hosts": ["spark2"]}]
    return config


def test_a_replica_on_a_worker_serves_there_behind_the_front(make_config: ConfigFactory) -> None:
    """Its server listens on the worker's fabric IP (the front reaches it there; the worker's
    firewall keeps the port to loopback and the fabric), with the key file on the worker, and
    is awaited there, probed directly with the key."""
    plan, graph = graph_of(replicas(make_config))
    server = graph.by_name["vllm-s1-container"].spec
    assert isinstance(server, ContainerSpec) and server.node.name == "spark2"
    assert flags(server.command, "--host") == ["10.241.0.12"]
    assert flags(server.command, "--nnodes") == ["1"]
    assert "--headless" not in server.command and "--key-file" in server.command
    key_dir = next(m.source for m in server.mounts if m.target == "/run/spark-vllm")
    assert key_dir.startswith("/home/aurora/") and key_dir.endswith("/secrets")
    key = graph.by_name["vllm-s1-api-key"]
    assert key.node == "spark2" and "vllm-s1-api-key" in graph.by_name["vllm-s1-container"].after
    ready = graph.by_name["vllm-s1-ready"]
    assert ready.node == "spark2"
    assert isinstance(ready.spec, StepSpec)
    words = shlex.split(ready.spec.create)
    assert flags(words, "--port") == ["8002"] and flags(words, "--probe-host") == ["10.241.0.12"]
    # Its memory check reads the running server's arguments on the worker, over the fabric.
    check = graph.by_name["memory-s1-check"].spec
    assert isinstance(check, StepSpec)
    assert flags(shlex.split(check.create), "--server-dest") == ["ssh://aurora@10.241.0.12:22"]
    assert not [w for w in words if w.startswith("--fabric-key")]
    # Nothing of the replica on the head but its route; on the worker, its port is guarded.
    guard = graph.by_name["firewall-spark2-guard"].spec
    assert isinstance(guard, ContainerSpec)
    assert "8002" in flags(guard.command, "--tcp-ports")[0].split(",")
    assert not [e for e in graph if e.name.startswith("vllm-s1-spark")]
    config = front_config(plan)
    assert "127.0.0.1:8001" in config and "10.241.0.12:8002" in config
    assert "balance leastconn" in config  # two replicas of one name: balanced, health-checked


def test_a_slot_left_beyond_the_fleet_has_its_ports_checked(make_config: ConfigFactory) -> None:
    """After removals a lone model can sit in slot 2: its ports (serverPort + 2) are checked
    against the published one at plan time, keyed."""
    config = fleet(make_config, 2, ("coder",))
    config["vllm"] = {**config["vllm"], "port": 8003}
    parsed = parse_stack_config({k: v for k, v in config.items() if k not in SECRETS})
    plan = plan_cluster(parsed, "spark-vllm/dev", None)
    with pytest.raises(
        ValueError, match=r"vllm.serverPort \+ 2 \(server 3\): 8003 is also vllm.port"
    ):
        placed(plan, {"coder": 2})


def test_a_lone_model_in_another_slot_keeps_the_record(make_config: ConfigFactory) -> None:
    """Once recorded, the slots are written with every change, one model left included: a
    stale record would give a switched model a slot still in use."""
    from stacks.config import parse_stack_config
    from stacks.plan.cluster import placed, plan_cluster

    parsed = parse_stack_config(
        {k: v for k, v in fleet(make_config, 2, ("coder",)).items() if k not in SECRETS}
    )
    plan = placed(plan_cluster(parsed, "spark-vllm/dev", None), {"qwen": 0, "coder": 2})
    create = write_front_config(plan).create
    assert "2 coder" in create and "/front/slots.tmp" in create
    never = plan_cluster(parsed, "spark-vllm/dev", None)  # never had several: no record
    assert "/front/slots" not in write_front_config(never).create


def test_a_ray_model_beside_an_mp_model(make_config: ConfigFactory) -> None:
    """One Ray model (on every host: its cluster spans them) beside an mp model: the cluster
    is the Ray model's (its containers' gate reads its marker, its memory check counts them),
    the mp server meets its own ranks, and the image is checked for both executors."""
    config = fleet(make_config, 2, ("qwen", "coder"))
    config["models"][1]["executor"] = "ray"
    _, graph = graph_of(config)
    assert {"ray-head", "ray-spark2", "ray-joined"} <= set(graph.by_name)
    labels = dict(graph.by_name["vllm-s1-container"].id_labels)
    assert list(labels.values()) == [("ray-joined",)]
    # Ray's containers waited for the first server's check: the Ray server waits for its own.
    assert "memory-s1-check" in graph.by_name["vllm-s1-container"].after
    assert dict(graph.by_name["vllm-container"].id_labels) != labels  # mp: its headless rank
    assert "vllm-spark2" in graph.by_name and "vllm-s1-spark2" not in graph.by_name
    ray_worker = graph.by_name["ray-spark2"].spec
    assert isinstance(ray_worker, ContainerSpec)
    gate = ray_worker.entrypoint[ray_worker.entrypoint.index("firewall-gate") + 1 :]
    assert gate[0].endswith("/applied-s1")
    checks = {
        name: flags(shlex.split(graph.by_name[name].spec.create), "--nodes")[0]  # type: ignore[union-attr]
        for name in ("memory-check", "memory-s1-check")
    }
    assert "spark-vllm-ray" not in checks["memory-check"]
    assert "spark-vllm-ray-head" in checks["memory-s1-check"]
    facts = graph.by_name["image-spark1-facts"].spec
    assert isinstance(facts, StepSpec)
    assert flags(shlex.split(facts.create), "--executor") == ["mp,ray"]


def test_a_ray_model_on_some_hosts_beside_an_mp_model(make_config: ConfigFactory) -> None:
    """A Ray model on the head and one worker, an mp model on a third host alone: Ray's cluster
    is those two nodes (its join wait expects them), the third node runs no Ray container (its
    guard keeps both executors' ports, as for any mp server: guarded_ports)."""
    config = fleet(make_config, 3, ("qwen", "coder"))
    config["models"][0].update(
        {"executor": "ray", "hosts": ["spark1", "spark2"], "tensorParallelSize": 2}
    )
    config["models"][1].update({"hosts": ["spark3"], "tensorParallelSize": 1})
    _, graph = graph_of(config)
    assert {"ray-head", "ray-spark2", "ray-joined"} <= set(graph.by_name)
    assert "ray-spark3" not in graph.by_name
    wait = graph.by_name["ray-joined"].spec
    assert isinstance(wait, StepSpec)
    words = shlex.split(wait.create)
    assert flags(words, "--expect-ips") == ["10.241.0.11,10.241.0.12"]
    assert flags(words, "--gpus") == ["2"]
    server = graph.by_name["vllm-s1-container"].spec
    assert isinstance(server, ContainerSpec) and server.node.name == "spark3"
    assert flags(server.command, "--distributed-executor-backend") == ["mp"]


def test_the_fleets_shares_are_on_the_head_before_any_memory_check(
    make_config: ConfigFactory,
) -> None:
    """Every server in the fleet's order (where each serves, its share, its hosts), written
    beside the head's scripts before the first memory check; memory-check.sh reads them there
    (the servers after its own keep their shares free): no check's command names them."""
    config = beside_on_the_head(make_config, 3)
    config["models"][0]["gpuMemoryUtilization"] = "auto"
    config["models"].append(
        {"id": "org/coder", "servedName": "coder", "hosts": ["spark3"], "tensorParallelSize": 1,
         "gpuMemoryUtilization": "auto"}
    )  # fmt: skip
    plan, graph = graph_of(config)
    shares = graph.by_name["spark1-shares"].spec
    assert isinstance(shares, StepSpec)
    written = hardware.memory_shares(plan)
    assert shlex.quote(written) in shares.create
    assert hardware.shares_file(plan) == f"{plan.head.bin_dir.removesuffix('/bin')}/front/shares"
    dest = plan.nodes[2].fabric_destination
    assert written.splitlines() == [
        "spark-vllm-shares 0.05 0.05",
        "qwen|spark-vllm-vllm|-|auto|spark1,spark2,spark3",
        "embed|spark-vllm-vllm-s1|-|0.2|spark1",
        f"coder|spark-vllm-vllm-s2|{dest}|auto|spark3",
    ]
    for check in ("memory-check", "memory-s1-check", "memory-s2-check"):
        assert "spark1-shares" in graph.by_name[check].after
        spec = graph.by_name[check].spec
        assert isinstance(spec, StepSpec) and "shares" not in spec.create
    _, one_graph = graph_of(fleet(make_config, 2, NAMES[:1]))
    assert "spark1-shares" not in one_graph.by_name


def test_a_model_added_after_an_auto_one_leaves_it_as_it_was(make_config: ConfigFactory) -> None:
    """The shares are rewritten; the auto model's check, server and everything else of it are
    not planned (its fraction stays what it was sized to; the new model's own check decides
    whether it fits beside it)."""
    before = beside_on_the_head(make_config, 2)
    before["models"][0]["gpuMemoryUtilization"] = "auto"
    after = copy.deepcopy(before)
    after["models"].append(
        {"id": "org/coder", "servedName": "coder", "hosts": ["spark2"], "tensorParallelSize": 1,
         "gpuMemoryUtilization": 0.1}
    )  # fmt: skip
    planned, deleted = up_then_preview(before, after)
    mine = ("weights-s2", "memory-s2", "vllm-s2")
    others = {n: s for n, s in planned.items() if not n.startswith(mine)}
    assert others == {
        **ROUTES,
        "spark1-shares": "update",
        "firewall-spark2-guard": "replace",
        "spark2-preflight": "update",
    }
    assert deleted == []


# An entry's own image's resources: `image-` and its key (the hash of its ref: image_key).
OWN = "image-i62e988a9"


def own_image(make_config: ConfigFactory) -> dict:
    """A model across both hosts from image.ref, and one on the worker alone from its own."""
    config = fleet(make_config, 2, ("qwen",))
    config["models"][0]["gpuMemoryUtilization"] = 0.5
    config["models"].append(
        {"id": "org/embed", "servedName": "embed", "hosts": ["spark2"], "tensorParallelSize": 1,
         "gpuMemoryUtilization": 0.2, "image": {"ref": "vllm/vllm-openai:v0.34.0"},
         "extraArgs": ["--task", "embed"]}
    )  # fmt: skip
    return config


def test_a_model_with_its_own_image_gets_it_where_it_runs(make_config: ConfigFactory) -> None:
    """Its image is pulled on the head, copied to its worker after image.ref's (one transfer
    per link), checked on both (its flags on the head, against it alone), kept in a history of
    its own, under a pinned name of its own; its containers, memory probe and waits run it."""
    plan, graph = graph_of(own_image(make_config))
    stream = image_streams(plan)[1]
    assert (stream.key, stream.image.ref) == ("i62e988a9", "vllm/vllm-openai:v0.34.0")
    assert [e.name for e in graph.of(f"{OWN}")] == [
        f"{OWN}-pull",
        f"{OWN}-head-record",
        f"{OWN}-spark2-sync",
        f"{OWN}-spark1-facts",
        f"{OWN}-spark2-facts",
        f"{OWN}-spark1-retain",
        f"{OWN}-spark2-retain",
    ]
    assert "image-spark2-sync" in graph.by_name[f"{OWN}-spark2-sync"].after
    # The weights' copies to the worker come after every image's: one transfer per link.
    assert f"{OWN}-spark2-sync" in graph.by_name["weights-spark2-copy"].after
    sources = g.later_sources(plan)
    assert sources[f"{OWN}.pinned"].resource == f"{OWN}-pull"
    assert sources[f"{OWN}.pinned"].derive("sha256:ab") == f"spark-vllm.invalid/{OWN}:sha256-ab"
    server = graph.by_name["vllm-s1-container"]
    assert server.image is not None and server.image.name == f"{OWN}.pinned"
    assert f"{OWN}-spark2-facts" in server.after
    assert graph.by_name["vllm-container"].image.name == "image.pinned"  # type: ignore[union-attr]

    def words_of(name: str) -> list[str]:
        spec = graph.by_name[name].spec
        assert isinstance(spec, StepSpec)
        return shlex.split(spec.create)

    assert flags(words_of("memory-s1-check"), "--image") == [f"@@{OWN}.pinned@@"]
    assert f"{OWN}-spark2-facts" in graph.by_name["memory-s1-check"].after
    assert flags(words_of("vllm-s1-ready"), "--image") == [f"@@{OWN}.pinned@@"]
    head_facts = words_of(f"{OWN}-spark1-facts")
    assert flags(head_facts, "--extra-args") == ['["--task", "embed"]']
    assert "--task" not in flags(words_of("image-spark1-facts"), "--extra-args")[0]
    history = flags(words_of(f"{OWN}-spark2-retain"), "--history")[0]
    assert history.endswith("/image-history-i62e988a9")
    retain = graph.by_name[f"{OWN}-spark2-retain"].spec
    assert (
        isinstance(retain, StepSpec)
        and retain.delete
        and "image-history-i62e988a9" in retain.delete
    )


def test_replicas_on_one_image_of_their_own_share_its_copies(make_config: ConfigFactory) -> None:
    """Both replicas run one image of their own: one stream (named after its ref), on both
    hosts; image.ref's is still pulled and copied (the firewall's guard runs it)."""
    config = replicas(make_config)
    for entry in config["models"]:
        entry["image"] = {"ref": "vllm/vllm-openai:v0.34.0"}
    plan, graph = graph_of(config)
    assert [s.key for s in image_streams(plan)] == ["", "i62e988a9"]
    assert [n.name for n in image_streams(plan)[1].nodes] == ["spark1", "spark2"]
    assert image_streams(plan)[0].models == ()
    pulls = sorted(e.name for e in graph if e.name.startswith("image") and e.name.endswith("-pull"))
    assert pulls == [f"{OWN}-pull", "image-pull"]
    for name in ("vllm-container", "vllm-s1-container"):
        assert graph.by_name[name].image.name == f"{OWN}.pinned"  # type: ignore[union-attr]
    facts = graph.by_name["image-spark1-facts"].spec
    assert isinstance(facts, StepSpec)
    assert flags(shlex.split(facts.create), "--executor") == ["mp"]


def test_adding_a_model_with_its_own_image_touches_nothing_of_the_others(
    make_config: ConfigFactory,
) -> None:
    before = fleet(make_config, 2, ("qwen",))
    before["models"][0]["gpuMemoryUtilization"] = 0.5
    planned, deleted = up_then_preview(before, own_image(make_config))
    created = {n for n, step in planned.items() if step == "create"}
    assert {n for n in created if n.startswith("image")} == {
        f"{OWN}-{step}"
        for step in ("pull", "head-record", "spark2-sync", "spark1-facts", "spark2-facts",
                     "spark1-retain", "spark2-retain")
    }  # fmt: skip
    untouched = {n: s for n, s in planned.items() if s != "create"}
    assert untouched == {
        **ROUTES,
        "firewall-spark2-guard": "replace",  # the worker's new server port
        "spark2-preflight": "update",
        "spark1-preflight": "update",  # one model became two: memory checks own the fractions
    }
    assert deleted == []


def test_removing_one_of_two_models_on_an_own_image_leaves_the_other_on_it(
    make_config: ConfigFactory,
) -> None:
    """Two models share an image of their own; the first of them goes: the image keeps its
    name (its ref's), so the other's server and the image's copies stay as they are."""
    before = fleet(make_config, 2)
    for entry in before["models"][1:]:
        entry["image"] = {"ref": "vllm/vllm-openai:v0.34.0"}
    after = copy.deepcopy(before)
    del after["models"][1]
    planned, deleted = up_then_preview(before, after)
    assert not {n for n in planned if n.startswith((OWN, "vllm-s2", "weights-s2", "memory-s2"))}
    assert all(n.startswith(("weights-s1", "memory-s1", "vllm-s1")) for n in deleted), deleted
