"""The plan and the graph of a config, for tests: planned, every step, each resolved with
known later values; and a config refused, with its message."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from stacks.config import (
    ServerSettings,
    parse_stack_config,
)
from stacks.plan import fabric, hosts, image, later, server, steps, weights
from stacks.plan import graph as g
from stacks.plan.cluster import ClusterPlan, plan_cluster
from stacks.plan.containers import EntryScripts
from stacks.plan.image import image_streams
from stacks.plan.instance import INSTANCE_ID
from stacks.plan.server_plan import per_server
from stacks.plan.steps import StepSpec
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate

IMAGE_ID = "sha256:" + "ab" * 32
MANIFEST = "c0ffee1234 7 123456"


# What the later values are once known (stacks/plan/later.py).
VALUES = {
    later.IMAGE_ID.name: IMAGE_ID,
    later.PINNED_IMAGE.name: image.pinned_image(IMAGE_ID),
    later.KV_BLOCK_SIZE.name: "16",
    INSTANCE_ID.name: "0123456789abcdef" * 2,
    **weights.manifest_values(MANIFEST),
}


def known(spec: StepSpec) -> StepSpec:
    """`spec` as the host runs it, with every later value known."""
    return steps.resolve_spec(spec, VALUES)


def plan_of(config: dict[str, Any]) -> ClusterPlan:
    return plan_cluster(parse_stack_config(config), "spark-vllm/test", None)


def every_step(plan: ClusterPlan) -> list[StepSpec]:
    """Every host step of `plan`, as the components register them."""
    specs: list[StepSpec] = []
    for node in plan.nodes:
        specs += [known(hosts.install_scripts(plan, node, "d" * 64))]
        specs += [hosts.preflight(plan, node)]
        firewall = hosts.firewall(plan, node)
        specs += [firewall] if firewall is not None else []
    specs += [fabric.head_fabric_key(plan)]
    for worker in plan.workers:
        specs += [fabric.authorize_head_key(plan, worker)]
        specs += [fabric.pin_worker_key(plan, worker)]
        specs += [known(image.sync_image(plan, worker, image_streams(plan)[0]))]
        specs += [known(weights.copy_weights(per_server(plan)[0], worker))]
    specs += [
        known(image.record_image(plan, image_streams(plan)[0])),
        weights.fetch_weights(per_server(plan)[0]),
    ]
    specs += [known(server.ray_wait(per_server(plan)[0])), server.front_key_file(plan)]
    specs += [hosts.write_front_config(plan)]
    specs += [known(server.vllm_ready(per_server(plan)[0]))]
    return specs


SCRIPTS = EntryScripts(
    launcher="echo launcher",
    gate="echo gate",
    guard="echo guard",
    exporter_gate="echo gate",
    memory_guard="print('memory guard')",
    docker_filter="print('docker filter')",
)


def graph_of(config: dict[str, Any]) -> tuple[ClusterPlan, g.DeploymentGraph]:
    plan = plan_of(config)
    facts = g.GraphFacts("d" * 64, SCRIPTS, {n.name: f"m-{n.name}" for n in plan.nodes})
    return plan, g.plan_graph(plan, facts)


PER_SERVER = [to_camel(name) for name in ServerSettings.model_fields]


def as_models(config: dict[str, Any], *extra: dict[str, Any]) -> dict[str, Any]:
    """The same stack with its model written as the one entry of `models` (plus `extra`)."""
    config = copy.deepcopy(config)
    model, vllm = config["model"], config["vllm"]
    entry = {key: model.pop(key) for key in ("id", "revision", "servedName") if key in model}
    entry.update({key: vllm.pop(key) for key in PER_SERVER if key in vllm})
    config["models"] = [entry, *extra]
    return config


NAMES = ("qwen", "embed", "coder")


def fleet(make_config: ConfigFactory, hosts: int, names: tuple[str, ...] = NAMES) -> dict:
    """A stack serving `names` (mp, on every host, 0.25 of each node's memory each)."""
    config = as_models(make_config(hosts=hosts, executor="mp"))
    first = config["models"][0]
    config["models"] = [
        {
            **copy.deepcopy(first),
            "id": f"org/{name}",
            "servedName": name,
            "gpuMemoryUtilization": 0.25,
        }
        for name in names
    ]
    return config


def error_of(config: dict[str, Any]) -> str:
    with pytest.raises(Exception) as caught:
        evaluate(config, SECRETS)
    assert type(caught.value).__name__ == "RunError", repr(caught.value)
    return str(caught.value)
