"""The fleet (stacks/fleet.py): `models` and `model` + `vllm` are one typed list; an existing
stack that moves its model into `models` plans nothing; every problem of a `models` list is one
keyed error before any resource, the memory budget of each node among them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stacks.config import (
    ImageConfig,
    ServedModelConfig,
    parse_stack_config,
)
from stacks.fleet import (
    MAX_NODE_SHARE,
    MIN_AUTO_SHARE,
    ServedModel,
    budget_problem,
    fleet_of,
)
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.goldens import GOLDEN, graph
from tests.program.planning import as_models, error_of
from tests.program.previews import plan


def parsed(config: dict[str, Any]) -> Any:
    return parse_stack_config({k: v for k, v in config.items() if k not in SECRETS})


@pytest.mark.parametrize("stack", ["dev", "lab"])
def test_one_entry_in_models_registers_the_committed_graph(
    stack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed stacks with their model written as `models`: byte for byte the graph
    they register with `model` + `vllm` (tests/program/golden)."""
    rewritten = graph(stack, tmp_path, monkeypatch, rewrite=as_models)
    assert rewritten == (GOLDEN / f"{stack}.json").read_text()


def test_moving_the_model_into_models_plans_no_change(make_config: ConfigFactory) -> None:
    before = make_config(hosts=2, executor=None)
    assert plan(before, as_models(before)) == {}


def test_the_fleet_reads_both_ways_alike(make_config: ConfigFactory) -> None:
    config = make_config(hosts=2)
    (legacy,) = fleet_of(parsed(config))
    (listed,) = fleet_of(parsed(as_models(config)))
    assert (legacy.model_key, legacy.settings_key) == ("model", "vllm")
    assert (listed.model_key, listed.settings_key) == ("models[0]", "models[0]")
    for served in (legacy, listed):
        assert served.hosts == ("spark1", "spark2")
        assert (served.id, served.revision, served.served_name) == (
            "Qwen/Qwen3.5-122B-A10B-FP8",
            "main",
            "qwen",
        )
        assert served.world_size == 2 and served.settings.max_model_len == 32768
        assert served.image.ref == "example/vllm-gb10:1.0"


def two_models(config: dict[str, Any], **second: Any) -> dict[str, Any]:
    embed = {"id": "BAAI/bge-m3", "servedName": "embed", "hosts": ["spark2"],
             "tensorParallelSize": 1, "gpuMemoryUtilization": 0.05, **second}  # fmt: skip
    if "models" in config:  # already a list: one more entry
        return {**config, "models": [*config["models"], embed]}
    return as_models(config, embed)


def with_first(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    config["models"][0].update(changes)
    return config


CASES = [
    ("a host that does not exist", lambda c: two_models(c, hosts=["spark9"]),
     "models[1].hosts[0]: no host is named 'spark9' (hosts: spark1, spark2)"),
    ("a host listed twice", lambda c: two_models(c, hosts=["spark2", "spark2"]),
     "models[1].hosts[1]: spark2 is listed twice"),
    ("tp x pp against its hosts' GPUs", lambda c: two_models(c, tensorParallelSize=2),
     "models[1].tensorParallelSize x models[1].pipelineParallelSize = 2 x 1 = 2, but its hosts "
     "(spark2) declare 1 GPU(s) in all"),
    ("tp x pp against every host's GPUs", lambda c: with_first(as_models(c), tensorParallelSize=1),
     "models[0].tensorParallelSize x models[0].pipelineParallelSize = 1 x 1 = 1, but the hosts "
     "declare 2"),
    ("two models under one name", lambda c: two_models(c, servedName="qwen"),
     "models[1].servedName: 'qwen' is already models[0]'s name for "
     "Qwen/Qwen3.5-122B-A10B-FP8@main, and this entry serves BAAI/bge-m3@main"),
    ("the memory budget of a node",
     lambda c: two_models(with_first(as_models(c), gpuMemoryUtilization=0.9),
                          gpuMemoryUtilization=0.1),
     "models[1].gpuMemoryUtilization: on spark2 the models' memory shares do not fit: "
     "models[0] (qwen) 0.9 + models[1] (embed) 0.1, and 0.05 beside each server = 1.10 of its "
     "memory, more than 0.98"),
    ("auto beside fixed shares that leave nothing",
     lambda c: two_models(with_first(as_models(c), gpuMemoryUtilization=0.85),
                          gpuMemoryUtilization="auto"),
     "models[1].gpuMemoryUtilization: on spark2 the models' memory shares do not fit: "
     "models[0] (qwen) 0.85 + models[1] (embed) auto (each auto at least 0.05), and 0.05 "
     "beside each server = 1.00"),
    ("a served name the front would read as a flag",
     lambda c: with_first(as_models(c), servedName="-i"),
     "models[0].servedName: String should match pattern"),
    ("a served name the front cannot match", lambda c: {**c, "model": {**c["model"],
                                                                       "servedName": "modèle"}},
     "model.servedName: String should match pattern"),
    ("two Ray servers on one node",
     lambda c: two_models(with_first(as_models(c), executor="ray"), executor="ray"),
     "models[1].executor: ray, like models[0], on spark2: vLLM's Ray executor takes each "
     "node's whole GPU"),
    ("an extraArgs flag spark-vllm sets, per entry",
     lambda c: two_models(c, extraArgs=["--port", "9000"]),
     "models[1].extraArgs[0]: --port is managed by spark-vllm"),
    ("a derived env key, per entry", lambda c: two_models(c, env={"NCCL_SOCKET_IFNAME": "x"}),
     "models[1].env.NCCL_SOCKET_IFNAME: is derived per node by spark-vllm"),
    ("model.id beside models", lambda c: {**as_models(c), "model": c["model"]},
     "model.id: `models` lists the models; set it on each entry there"),
    ("a per-server vllm key beside models",
     lambda c: {**as_models(c), "vllm": {"maxModelLen": 4096}},
     "vllm.maxModelLen: `models` lists the models; set it on each entry there"),
    ("no model at all", lambda c: {**c, "model": {"cacheDir": c["model"]["cacheDir"]}},
     "model.id: is required (or list the models under `models`)"),
    ("an entry without its parallel size",
     lambda c: {**as_models(c), "models": [{"id": "org/m"}]},
     "models[0].tensorParallelSize: is required"),
    ("an empty entry list is no list", lambda c: {**as_models(c), "models": []},
     "model.id: is required"),
    ("image.ref's ref with other settings",
     lambda c: with_first(as_models(c), image={"ref": c["image"]["ref"], "keepPrevious": 3}),
     "models[0].image: example/vllm-gb10:1.0 is also image's, with other settings"),
    ("one own ref with two settings",
     lambda c: two_models(with_first(as_models(c), image={"ref": "o/v:1"}),
                          image={"ref": "o/v:1", "keepOnDestroy": False}),
     "models[1].image: o/v:1 is also models[0].image's, with other settings"),
    # What this release deploys (the checks above hold first).
    ("a host no model is placed on", lambda c: with_first(as_models(c), hosts=["spark1"],
                                                          tensorParallelSize=1),
     "hosts[1]: no model is placed on spark2; list it in a model's hosts, or remove it"),
    ("a Ray model without the head beside another",
     lambda c: two_models(with_first(as_models(c), executor="mp", gpuMemoryUtilization=0.5),
                          executor="ray", gpuMemoryUtilization=0.3),
     "models[1].hosts: a Ray model runs on the head (spark1), where Ray's head and the model's "
     "server (its driver) run"),
    ("several servers' ports past the last port",
     lambda c: {**two_models(with_first(as_models(c), executor="mp", gpuMemoryUtilization=0.5),
                             hosts=None, tensorParallelSize=2, gpuMemoryUtilization=0.3),
                "vllm": {"masterPort": 65480}},
     "vllm.masterPort: 65480 puts vLLM's own ports (vllm.masterPort + 1 to + 65: 65481-65545) "
     "past 65535; use a masterPort of at most 65470"),
    ("the second server's port on the published one",
     lambda c: {**two_models(with_first(as_models(c), executor="mp", gpuMemoryUtilization=0.5),
                             hosts=None, tensorParallelSize=2, gpuMemoryUtilization=0.3),
                "vllm": {"port": 8002}},
     "vllm.serverPort + 1 (server 2): 8002 is also vllm.port"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_fleet_problem_is_one_keyed_error(
    make_config: ConfigFactory, change: Any, expected: str
) -> None:
    message = error_of(change(make_config(hosts=2)))
    assert expected in message, message
    assert "Traceback" not in message


def test_replicas_share_a_name_and_the_budget_counts_each_node_apart(
    make_config: ConfigFactory,
) -> None:
    """One servedName twice with one id: replicas, no error from the names. Their shares
    are each node's own: 0.5 on spark1 and 0.5 on spark2 fit."""
    config = make_config(hosts=2, executor="mp")
    replica = {"id": "BAAI/bge-m3", "servedName": "embed", "tensorParallelSize": 1,
               "gpuMemoryUtilization": 0.35}  # fmt: skip
    config = as_models(config, {**replica, "hosts": ["spark1"]}, {**replica, "hosts": ["spark2"]})
    with_first(config, gpuMemoryUtilization=0.5)
    replicas = [m for m in parsed(config).fleet if m.served_name == "embed"]
    assert [m.hosts for m in replicas] == [("spark1",), ("spark2",)]
    # The same patterns on both (as here: none) are replicas; different ones are two cuts of
    # the snapshot under one name, and refused naming both.
    config["models"][2]["exclude"] = ["onnx/*"]
    message = error_of(config)
    assert "models[2].include/exclude: 'embed' is also models[1]'s, whose patterns differ" in (
        message
    ), message
    config["models"][1]["exclude"] = ["onnx/*"]
    assert [m.exclude for m in parsed(config).fleet][1:] == [("onnx/*",), ("onnx/*",)]


BUDGET = [
    # (shares on one node in declared order, fits): each server adds SERVER_OVERHEAD_SHARE
    ([0.98], True),  # one server: its own bound holds it
    ([0.75, 0.03], True),  # what GB10 users run beside an embedder (research notes)
    ([0.9, 0.08], False),  # what failed for them: vLLM's startup check
    ([0.5, 0.38], True),
    ([0.5, 0.39], False),
    ([0.8, "auto"], True),
    ([0.84, "auto"], False),
    (["auto", "auto"], True),
    ([0.73, "auto", "auto"], True),
    ([0.74, "auto", "auto"], False),
]


def served(index: int, share: float | str) -> ServedModel:
    entry = ServedModelConfig.model_validate(
        {
            "id": f"org/m{index}",
            "servedName": f"m{index}",
            "tensorParallelSize": 1,
            "gpuMemoryUtilization": share,
        }
    )
    key = f"models[{index}]"
    return ServedModel(key, key, entry.id, entry.revision, f"m{index}", ("spark1",), entry,
                       ImageConfig(ref="x:1"))  # fmt: skip


@pytest.mark.parametrize(("shares", "fits"), BUDGET, ids=[str(b[0]) for b in BUDGET])
def test_the_memory_budget_of_one_node(shares: list[Any], fits: bool) -> None:
    fleet = [served(i, share) for i, share in enumerate(shares)]
    problem = budget_problem(fleet, ["spark0", "spark1"])
    assert (problem is None) == fits, problem
    if not fits:
        assert problem is not None and f"more than {MAX_NODE_SHARE}" in problem
        assert problem.startswith(f"models[{len(shares) - 1}].gpuMemoryUtilization: on spark1 ")
        for i in range(len(shares)):
            assert f"models[{i}] (m{i})" in problem
        if "auto" in shares:
            assert f"each auto at least {MIN_AUTO_SHARE}" in problem
