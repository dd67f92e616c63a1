"""Several models on one cluster, for real: the committed lab stack (mp, both hosts, through the
bastion) serving one model, then its next `pulumi up`s: a second model added, its flags
changed, switched for a third, a memory budget that cannot fit, and the model removed. A client
asks the first model for completions through every run and counts the requests that failed
(goal: 0); each row's plan, wall time and downtime of /v1/models go to the day-two table."""

from __future__ import annotations

import json
import math
import os
import shlex
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import HF_MODEL, HF_MORE_MODELS, Lab
from lab.monitor import free_port, graph_url, screenshot, tunnel
from lab.monitoring_image import MONITORING_IMAGE, monitoring_rootfs
from lab.monitoring_image import import_argv as monitoring_import_argv
from lab.stack import PROJECT, SERVED_NAME
from stacks.plan.image import image_key
from tests.lab import attacker
from tests.lab.day_two import Stack, deployed, next_up
from tests.lab.deploying import (
    API_KEY,
    PREFIX,
    RequestLoop,
    as_fleet,
    complete,
    default_lab_config,
    deploy,
    host_sh,
    models_listed,
    reachable_from_bastion,
)
from tests.lab.engine import NextUp
from tests.lab.realmocks import RealMocks
from tests.lab.timings import record_figure, record_timing
from tests.standin.dashboards import dashboard_queries

pytestmark = pytest.mark.lab

SECOND, THIRD = "tiny-chat-b", "tiny-chat-c"
LAB_IMAGE, OWN_IMAGE = "spark-vllm-lab:latest", "spark-vllm-lab:own"  # one image, two tags
# The first model keeps the committed lab stack's `auto`; the others get small fixed fractions
# (the hosts share this machine's memory).
SHARE = 0.15
# What every change to the fleet plans beside the changed model's own resources: the routes
# (and the head's record of the slots) and the front's reload; with a server added or removed,
# the ports each host's guard keeps and preflight checks.
ROUTES = {"front-config", "front-reload"}
PORTS = {"firewall-spark1-guard", "firewall-spark2-guard", "spark1-preflight", "spark2-preflight"}
# The fleet's memory shares on the head, which the first (`auto`) model's check reads: written
# whenever the fleet changes, and that check left as it was.
SHARES = {"spark1-shares"}


def one_model(lab: Lab) -> dict[str, Any]:
    """The committed lab stack (`model` + `vllm`, gpuMemoryUtilization auto)."""
    return default_lab_config(lab)


def fleet(lab: Lab, *models: tuple[str, str], **second: Any) -> dict[str, Any]:
    """The same stack with `models`: (id, servedName) each, on every host, the first `auto`,
    the others SHARE; `second` changes the second entry's settings."""
    config = as_fleet(one_model(lab), *models)
    for entry in config[f"{PROJECT}:models"][1:]:
        entry["gpuMemoryUtilization"] = SHARE
    if len(models) > 1:
        config[f"{PROJECT}:models"][1].update(second)
    return config


@pytest.fixture(scope="module")
def stack(lab_factory: Callable[..., Lab]) -> Iterator[Stack]:
    lab = lab_factory("fleet", hosts=2, topology="bastion")
    started = time.monotonic()
    with deployed(lab, one_model(lab)) as stack:
        record_timing(
            "several models: first up (one model, bastion, mp)", time.monotonic() - started
        )
        yield stack
    lab.down()


def changed_while_serving(stack: Stack, scenario: str, config: dict[str, Any]) -> NextUp:
    """The next `pulumi up` while a client asks the first model for completions: not one of
    them may fail."""
    with RequestLoop(stack.endpoint, SERVED_NAME) as loop:
        run = next_up(stack, scenario, config)
    record_figure(f"several models: {scenario}", loop.summary())
    assert loop.sent > 10 and loop.failures == [], loop.summary()
    return run


def listed(stack: Stack) -> list[str]:
    return models_listed(stack.endpoint)


def own(run: NextUp, slot: str) -> dict[str, str]:
    """The run's steps on resources of server `slot` (`s1`...)."""
    mine = (f"weights-{slot}", f"memory-{slot}", f"vllm-{slot}")
    return {name: op for name, op in run.changed().items() if name.startswith(mine)}


def others(run: NextUp, slot: str) -> set[str]:
    return set(run.changed()) - set(own(run, slot))


def containers(stack: Stack, host: str) -> set[str]:
    names = host_sh(stack.lab, host, "docker ps --format '{{.Names}}'")
    return {n for n in names.split() if n.startswith(f"{PREFIX}-vllm")}


def test_a_second_model_is_added_beside_the_first(stack: Stack) -> None:
    run = changed_while_serving(
        stack, "add a model", fleet(stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND))
    )
    assert set(own(run, "s1").values()) == {"create"}, run.changed()
    assert others(run, "s1") == ROUTES | PORTS | SHARES, run.changed()
    assert run.changed()["spark1-shares"] == "create"
    assert listed(stack) == [SERVED_NAME, SECOND]
    for model in (SERVED_NAME, SECOND):  # the official client, one endpoint, each model
        attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, model)
    for host in ("spark1", "spark2"):
        assert containers(stack, host) == {f"{PREFIX}-vllm", f"{PREFIX}-vllm-s1"}
    names = [m["servedName"] for m in stack.outputs["models"]]
    assert names == [SERVED_NAME, SECOND] and stack.outputs["modelId"] == SERVED_NAME


# Named keys (`keys`): a second project's, limited to the second model and 5 requests a
# minute, and one for every model.
TEAM_KEY, NOTEBOOK_KEY = "team-a-lab-key-6b1e9d0c3f7a2e58", "notebook-lab-key-0d4c8e2a9f1b7e36"
FRONT_ONLY = {"front-config": "update", "front-reload": "replace"}


def keyed(base: str, key: str, model: str) -> tuple[int, dict[str, str]]:
    """A completion's status and headers at `base` (`.../v1`) with `key`."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        base + "/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}


def test_keys_per_user_are_a_reload_of_the_front_and_nothing_else(stack: Stack) -> None:
    """Two named keys added, then revoked, while the operator's key serves: each `up` plans
    the front's key map, configuration and reload only; the limited key reaches only its model,
    is refused past its rate, and its requests are counted; once revoked both are refused."""
    started = time.monotonic()
    before = stack.config
    keys = [
        {"name": "team-a", "models": [SECOND], "requestsPerMinute": 5, "key": TEAM_KEY},
        {"name": "notebook", "key": NOTEBOOK_KEY},
    ]
    try:
        run = changed_while_serving(stack, "add two keys", {**before, f"{PROJECT}:keys": keys})
        assert run.changed() == {"front-keys": "create", **FRONT_ONLY}
        the_keys_serve(stack)
    finally:  # the next tests start from the stack without keys
        run = changed_while_serving(stack, "revoke every key", before)
    assert run.changed() == {"front-keys": "delete", **FRONT_ONLY}
    for key in (TEAM_KEY, NOTEBOOK_KEY):
        assert keyed(stack.endpoint, key, SECOND)[0] == 401
    record_timing("several models: keys added, used and revoked", time.monotonic() - started)


def the_keys_serve(stack: Stack) -> None:
    """Once the front reloaded (the step sends the signal; HAProxy loads the new configuration
    after it), team-a reaches only its model and its rate, notebook every model, and each
    key's requests are counted; no key's value is in the front's configuration or log."""
    deadline = time.monotonic() + 10
    while keyed(stack.endpoint, NOTEBOOK_KEY, SERVED_NAME)[0] != 200:
        if time.monotonic() > deadline:
            raise AssertionError(
                "the named key is refused after the reload:\n"
                + host_sh(
                    stack.lab,
                    "spark1",
                    f"ls -la ~/.spark-vllm/*/secrets; docker logs --tail 20 {PREFIX}-front 2>&1;"
                    f" docker exec {PREFIX}-front grep -n key /spark-vllm/front/haproxy.cfg",
                )
            )
        time.sleep(0.2)
    assert keyed(stack.endpoint, TEAM_KEY, SECOND)[0] == 200
    assert keyed(stack.endpoint, TEAM_KEY, SERVED_NAME)[0] == 403
    assert models_listed(stack.endpoint, TEAM_KEY) == [SECOND]
    assert models_listed(stack.endpoint, NOTEBOOK_KEY) == [SERVED_NAME, SECOND]
    # team-a's 4th, 5th and 6th requests of the minute (/v1/models counts too).
    statuses = [keyed(stack.endpoint, TEAM_KEY, SECOND) for _ in range(3)]
    assert [status for status, _ in statuses] == [200, 200, 429]
    assert statuses[2][1]["retry-after"] == "60"
    metrics = host_sh(stack.lab, "spark1", "curl -s 127.0.0.1:8404/metrics/keys")
    assert 'spark_vllm_key_requests_total{key="team-a"} 6' in metrics, metrics
    assert 'spark_vllm_key_requests_total{key="notebook"} 2' in metrics, metrics
    for value in (TEAM_KEY, NOTEBOOK_KEY):  # not in the front's configuration or its log
        assert value not in host_sh(stack.lab, "spark1", f"docker logs {PREFIX}-front 2>&1")
        assert value not in host_sh(
            stack.lab, "spark1", f"docker exec {PREFIX}-front cat /spark-vllm/front/haproxy.cfg"
        )
    the_front_refuses_admin_routes_and_two_model_bodies(stack.endpoint)  # after the counts


def raw_status(base: str, method: str, path: str, key: str, body: bytes) -> int:
    """The status of `method base+path` with `key` and a raw JSON `body`."""
    request = urllib.request.Request(
        base.removesuffix("/v1") + path, data=body, method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def the_front_refuses_admin_routes_and_two_model_bodies(base: str) -> None:
    """Safe by default (docs/security.md): a named key reaches only the client routes (vLLM's
    admin routes that flags turn on are 403 at the front), and a body whose `model` the front
    and vLLM could read differently is a 400 for every key (tests/program/test_front_refusals.py
    has the whole table, on loopback)."""
    for path in ("/scale_elastic_ep", "/v1/load_lora_adapter", "/start_profile", "/metrics"):
        method = "GET" if path == "/metrics" else "POST"
        assert raw_status(base, method, path, NOTEBOOK_KEY, b"{}") == 403, path
    two = f'{{"model": "{SECOND}", "model": "{SERVED_NAME}", "prompt": "Hi"}}'.encode()
    for key in (NOTEBOOK_KEY, API_KEY):
        assert raw_status(base, "POST", "/v1/completions", key, two) == 400, key


def test_changing_one_models_flags_replaces_only_its_server(stack: Stack) -> None:
    config = fleet(
        stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND), maxModelLen=1024
    )
    run = changed_while_serving(stack, "change one model's flags", config)
    assert own(run, "s1") == {
        "vllm-s1-container": "replace",
        "vllm-s1-spark2": "replace",
        "vllm-s1-ready": "replace",
    }
    assert others(run, "s1") == ROUTES  # /v1/models shows its new context length


def test_switching_one_model_for_another_keeps_its_slot(stack: Stack) -> None:
    config = fleet(stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[1], THIRD), maxModelLen=1024)
    run = changed_while_serving(stack, "switch one model for another", config)
    assert set(own(run, "s1").values()) <= {"update", "replace"}, run.changed()
    assert others(run, "s1") == ROUTES | SHARES, run.changed()
    assert listed(stack) == [SERVED_NAME, THIRD]
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, THIRD)


def test_a_budget_that_does_not_fit_is_refused_before_anything_changes(stack: Stack) -> None:
    config = fleet(
        stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[1], THIRD), gpuMemoryUtilization=0.9
    )
    run = NextUp(stack.state)
    with pytest.raises(Exception, match=r"models\[1\].gpuMemoryUtilization: on spark1"):
        deploy(stack.lab, run, config)
    assert run.commands_run == 0 and run.changed() == {}
    assert listed(stack) == [SERVED_NAME, THIRD]


def test_removing_a_model_deletes_only_its_own(stack: Stack) -> None:
    run = changed_while_serving(stack, "remove a model", fleet(stack.lab, (HF_MODEL, SERVED_NAME)))
    assert set(own(run, "s1").values()) == {"delete"}, run.changed()
    assert others(run, "s1") == ROUTES | PORTS | SHARES, run.changed()
    for host in ("spark1", "spark2"):
        assert containers(stack, host) == {f"{PREFIX}-vllm"}
    assert listed(stack) == [SERVED_NAME]


def test_a_model_on_the_head_alone_runs_nothing_on_the_worker(stack: Stack) -> None:
    config = fleet(stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND))
    config[f"{PROJECT}:models"][1].update({"hosts": ["spark1"], "tensorParallelSize": 1})
    run = changed_while_serving(stack, "add a model on the head alone", config)
    assert own(run, "s1") == {
        "weights-s1-fetch": "create",
        "memory-s1-check": "create",
        "vllm-s1-container": "create",
        "vllm-s1-ready": "create",
    }
    # The worker's guard and preflight keep their ports (the lab checks no unified memory, so
    # no fraction changes either).
    assert others(run, "s1") == ROUTES | SHARES | {"firewall-spark1-guard", "spark1-preflight"}, (
        run.changed()
    )
    assert containers(stack, "spark1") == {f"{PREFIX}-vllm", f"{PREFIX}-vllm-s1"}
    assert containers(stack, "spark2") == {f"{PREFIX}-vllm"}
    assert listed(stack) == [SERVED_NAME, SECOND]
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, SECOND)


def test_a_model_moved_to_the_worker_serves_there_behind_the_front(stack: Stack) -> None:
    """The second model's entry now lists the worker alone: its server moves there (its slot
    kept: replaced, deleted first), listens on the worker's fabric IP, and answers through
    the front on the head."""
    config = fleet(stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND))
    config[f"{PROJECT}:models"][1].update({"hosts": ["spark2"], "tensorParallelSize": 1})
    changed_while_serving(stack, "move a model to the worker", config)
    assert containers(stack, "spark1") == {f"{PREFIX}-vllm"}
    assert containers(stack, "spark2") == {f"{PREFIX}-vllm", f"{PREFIX}-vllm-s1"}
    assert listed(stack) == [SERVED_NAME, SECOND]
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, SECOND)
    # Its port is not open on the management network (the bastion's), only on the fabric.
    assert not reachable_from_bastion(stack.lab, stack.lab.spec.host_mgmt_ip(1), 8002)


def test_a_model_from_its_own_image(stack: Stack) -> None:
    """The model on the worker now runs its own image (the lab's image under another tag on the
    head): that image is pulled, named and copied for it alone (the `image-i<hash>` resources), its
    server replaced onto it; nothing of the first model or of image.ref's changes."""
    host_sh(stack.lab, "spark1", f"docker tag {LAB_IMAGE} {OWN_IMAGE}")
    config = fleet(stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND))
    config[f"{PROJECT}:models"][1].update(
        {"hosts": ["spark2"], "tensorParallelSize": 1, "image": {"ref": OWN_IMAGE}}
    )
    run = changed_while_serving(stack, "a model from its own image", config)
    changed = run.changed()
    own = f"image-{image_key(OWN_IMAGE)}"
    streamed = {n: op for n, op in changed.items() if n.startswith(own)}
    assert set(streamed.values()) == {"create"} and f"{own}-spark2-sync" in streamed, changed
    assert not {n for n in changed if n in ("vllm-container", "vllm-spark2", "vllm-ready")}
    assert not {n for n in changed if n.startswith("image-") and not n.startswith(own)}
    assert changed["vllm-s1-container"] == "replace", changed
    worker = host_sh(
        stack.lab, "spark2", f"docker inspect -f '{{{{.Config.Image}}}}' {PREFIX}-vllm-s1"
    )
    assert worker.strip().startswith(f"spark-vllm.invalid/{own}:"), worker
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, SECOND)


def served_by(stack: Stack, host: str, address: str, port: int) -> int:
    """How many requests the server at `address:port` on `host` answered (its /metrics)."""
    metrics = host_sh(stack.lab, host, f"curl -s http://{address}:{port}/metrics")
    found = [line for line in metrics.splitlines() if line.startswith("vllm:request_success_total")]
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in found)


def test_replicas_are_balanced_and_one_stopped_costs_no_request(stack: Stack) -> None:
    """The second model on each host alone, under one name: the front balances the two, and
    once one is stopped the other answers every request."""
    config = fleet(stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[0], SECOND))
    entry = {**config[f"{PROJECT}:models"][1], "tensorParallelSize": 1}
    config[f"{PROJECT}:models"][1:] = [
        {**entry, "hosts": ["spark1"]},
        {**entry, "hosts": ["spark2"]},
    ]
    changed_while_serving(stack, "a second replica", config)
    assert listed(stack) == [SERVED_NAME, SECOND]
    fabric_ip = stack.lab.spec.host_fabric_ip(1)
    on_head = ("spark1", "127.0.0.1", 8002)
    on_worker = ("spark2", fabric_ip, 8003)
    before = [served_by(stack, *where) for where in (on_head, on_worker)]
    for _ in range(20):
        assert complete(stack.endpoint, SECOND)[0] == 200
    after = [served_by(stack, *where) for where in (on_head, on_worker)]
    shares = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(shares) == 20 and min(shares) >= 5, shares  # both served (leastconn)
    record_figure("several models: replicas, 20 requests", f"{shares[0]} + {shares[1]}")
    host_sh(stack.lab, "spark2", f"docker stop -t 2 {PREFIX}-vllm-s2")
    with RequestLoop(stack.endpoint, SECOND) as loop:
        time.sleep(8)
    record_figure("several models: one replica stopped", loop.summary())
    assert loop.sent > 20 and loop.failures == [], loop.summary()


def test_a_ray_model_beside_an_mp_model(stack: Stack) -> None:
    """The replicas give way to a model with executor ray on every host (its Ray cluster is
    created for it) beside the first, mp model, which keeps serving."""
    config = fleet(stack.lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[1], THIRD), executor="ray")
    config[f"{PROJECT}:ray"] = {"objectStoreMemoryBytes": 200_000_000}  # the hosts share memory
    run = changed_while_serving(stack, "a Ray model beside an mp model", config)
    created = {name for name, op in run.changed().items() if op == "create"}
    assert {"ray-head", "ray-spark2", "ray-joined"} <= created, run.changed()
    assert not {n for n in run.changed() if n in ("vllm-container", "vllm-spark2", "vllm-ready")}
    assert listed(stack) == [SERVED_NAME, THIRD]
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, THIRD)
    # It took the slot the replicas freed first (1): its driver on the head, its ranks in Ray.
    for host, ray, driver in (("spark1", "ray-head", True), ("spark2", "ray-worker", False)):
        names = host_sh(stack.lab, host, "docker ps --format '{{.Names}}'").split()
        assert f"{PREFIX}-{ray}" in names, names
        assert (f"{PREFIX}-vllm-s1" in names) is driver, names


def ray_on_the_head(lab: Lab) -> dict[str, Any]:
    """The first model (mp, both hosts) and a Ray model on the head alone."""
    config = fleet(lab, (HF_MODEL, SERVED_NAME), (HF_MORE_MODELS[1], THIRD), executor="ray")
    config[f"{PROJECT}:models"][1].update({"hosts": ["spark1"], "tensorParallelSize": 1})
    config[f"{PROJECT}:ray"] = {"objectStoreMemoryBytes": 200_000_000}
    return config


def test_the_ray_model_shrinks_to_the_head(stack: Stack) -> None:
    """The Ray model's entry now lists the head alone: its cluster is the head's node (the
    worker's Ray container goes), the mp model across both hosts keeps serving."""
    config = ray_on_the_head(stack.lab)
    run = changed_while_serving(stack, "a Ray model shrunk to the head", config)
    assert run.changed().get("ray-spark2") == "delete", run.changed()
    assert not {n for n in run.changed() if n in ("vllm-container", "vllm-spark2", "vllm-ready")}
    assert listed(stack) == [SERVED_NAME, THIRD]
    attacker.assert_the_openai_client_streams(stack.endpoint, API_KEY, THIRD)
    worker = host_sh(stack.lab, "spark2", "docker ps --format '{{.Names}}'").split()
    assert f"{PREFIX}-ray-worker" not in worker and f"{PREFIX}-vllm" in worker, worker
    head = host_sh(stack.lab, "spark1", "docker ps --format '{{.Names}}'").split()
    assert {f"{PREFIX}-ray-head", f"{PREFIX}-vllm-s1", f"{PREFIX}-vllm"} <= set(head), head


# Monitoring as the lab runs it: Debian's Prometheus and node_exporter (lab/monitoring_image.py)
# where users pull the official images; no Grafana (no offline package: the dashboards are
# checked through their queries below). A 2 s scrape interval, so that rates have samples within
# seconds (the default, 15 s, would make this row wait a minute).
LAB_MONITORING = {
    "enabled": True,
    "prometheus": {"image": {"ref": MONITORING_IMAGE}, "scrapeIntervalSeconds": 2},
    "grafana": {"enabled": False},
    "nodeExporter": {"image": {"ref": MONITORING_IMAGE}},
}
RATE_WINDOW = "10s"  # Grafana's $__rate_interval at a 2 s scrape interval, and some


def prometheus_api(stack: Stack, path: str, **params: str) -> Any:
    """Prometheus's HTTP API on the head's loopback (where it listens)."""
    query = " ".join(f"--data-urlencode {shlex.quote(f'{k}={v}')}" for k, v in params.items())
    answer = host_sh(stack.lab, "spark1", f"curl -sfG {query} http://127.0.0.1:9090{path}")
    return json.loads(answer)["data"]


def test_monitoring_turned_on_scrapes_every_model_and_node(stack: Stack, tmp_path: Path) -> None:
    """monitoring.enabled on the serving fleet: only its own resources are created (nothing that
    serves is touched), Prometheus finds every target up, every dashboard query returns series
    for each deployed model and node, and none of the metrics is reachable from the management
    network (nor through the front without the key)."""
    tar = tmp_path / "monitoring.tar"
    monitoring_rootfs(tar)
    for host in stack.lab.spec.host_names:
        stack.lab.import_tarball(host, tar, monitoring_import_argv())
    config = {**ray_on_the_head(stack.lab), f"{PROJECT}:monitoring": LAB_MONITORING}
    run = changed_while_serving(stack, "monitoring turned on", config)
    changed = run.changed()
    assert set(changed.values()) == {"create"}, changed
    assert all(name.startswith("monitoring-") for name in changed), changed
    summary = stack.outputs["monitoring"]
    assert summary["prometheus"]["url"] == "http://127.0.0.1:9090", summary
    assert "monitoring: vllm: 2 of 2 targets up" in summary["targets"], summary
    assert "monitoring: node: 2 of 2 targets up" in summary["targets"], summary
    targets = prometheus_api(stack, "/api/v1/targets", state="active")["activeTargets"]
    health = {(t["labels"]["job"], t["labels"].get("node"), t["health"]) for t in targets}
    record_figure(
        "several models: monitoring targets",
        ", ".join(f"{job}@{node} {up}" for job, node, up in sorted(health)),
    )
    # Every target up; the lab's Ray (a minimal install, as in vLLM's images) exports no
    # metrics, so its node is said and left out rather than kept as a target always down.
    assert {(job, node) for job, node, _ in health} == {
        ("vllm", "spark1"), ("front", "spark1"), ("node", "spark1"), ("node", "spark2"),
        ("prometheus", "spark1"),
    }, health  # fmt: skip
    assert all(t["health"] == "up" for t in targets), targets
    ray = [line for line in summary["targets"] if line.startswith("monitoring: ray: spark1")]
    assert len(ray) == 1 and "exports no metrics" in ray[0], summary
    assert {t["labels"]["model"] for t in targets if t["labels"]["job"] == "vllm"} == {
        SERVED_NAME,
        THIRD,
    }
    # Every dashboard query, as Grafana sends it, returns series for each model and node while
    # both models serve.
    with RequestLoop(stack.endpoint, SERVED_NAME), RequestLoop(stack.endpoint, THIRD):
        time.sleep(12)
        empty, seen = [], {}
        for title, expr in dashboard_queries():
            sent = expr.replace("$model_name", ".+").replace("$__rate_interval", RATE_WINDOW)
            result = prometheus_api(stack, "/api/v1/query", query=sent)["result"]
            label = "model_name" if "$model_name" in expr else "node"
            seen[title] = {series["metric"].get(label) for series in result}
            if not result or any(math.isnan(float(s["value"][1])) for s in result):
                empty.append(title)
        shot = os.environ.get("SPARK_VLLM_SCREENSHOT")
        if shot:  # docs/monitoring.md's picture: a minute more of load, then Prometheus's graph
            time.sleep(60)
            with tunnel(stack.lab, free_port()) as base:
                screenshot(graph_url(base, minutes=2), Path(shot))
    assert empty == [], f"queries without series (or NaN): {empty}"
    for title, labels in seen.items():
        expected = {SERVED_NAME, THIRD} if "node" not in title.lower() else {"spark1", "spark2"}
        assert labels == expected, (title, labels)
    # Nothing of it from the management network: Prometheus, the front's metrics, the servers'
    # own ports, the exporters; and the front wants the key for /metrics too.
    head, worker = (stack.lab.spec.host_mgmt_ip(i) for i in (0, 1))
    for address, port in ((head, 9090), (head, 8404), (head, 8001), (head, 8002), (head, 19100),
                          (worker, 19100), (worker, 8001)):  # fmt: skip
        assert not reachable_from_bastion(stack.lab, address, port), (address, port)
    status = stack.lab.sh(
        "bastion", f"curl -s -o /dev/null -w '%{{http_code}}' http://{head}:8000/metrics"
    ).stdout.strip()
    assert status == "401", status


def test_monitoring_turned_off_deletes_only_its_own(stack: Stack) -> None:
    run = changed_while_serving(stack, "monitoring turned off", ray_on_the_head(stack.lab))
    changed = run.changed()
    assert set(changed.values()) == {"delete"}, changed
    assert all(name.startswith("monitoring-") for name in changed), changed
    for host in stack.lab.spec.host_names:
        names = host_sh(stack.lab, host, "docker ps -a --format '{{.Names}}'").split()
        assert not [n for n in names if "prometheus" in n or "exporter" in n], names
    # Its files and Prometheus's data (written as root) are gone from the stack's directory.
    left = host_sh(stack.lab, "spark1", "ls -A /root/.spark-vllm/monitoring 2>&1; true")
    assert "No such file" in left, left
    assert "monitoring" not in stack.outputs


# A second stack on the same hosts: its own prefix, ports, state directory and firewall chain.
SECOND_STACK = "lab2"
SECOND_PREFIX = "svl2"


def second_stack(lab: Lab) -> dict[str, Any]:
    """The committed lab stack moved out of the first one's way: every port it listens on, and
    a fixed share of memory (the hosts share this machine's). Ray's ports stay the defaults,
    which the first stack's Ray model holds on the head: an mp stack's guard keeps them too
    (for a switch of executors), and preflight lets another stack's containers hold them."""
    config = one_model(lab)
    config[f"{PROJECT}:docker"] = {**config[f"{PROJECT}:docker"], "containerPrefix": SECOND_PREFIX}
    config[f"{PROJECT}:vllm"] = {**config[f"{PROJECT}:vllm"], "port": 8100, "serverPort": 8101,
                                 "masterPort": 29601, "gpuMemoryUtilization": SHARE}  # fmt: skip
    config[f"{PROJECT}:front"] = {**config[f"{PROJECT}:front"], "metricsPort": 8405}
    config[f"{PROJECT}:monitoring"] = {"nodeExporter": {"port": 19101}}
    return config


def chains(stack: Stack, host: str) -> str:
    return host_sh(stack.lab, host, "iptables -w 10 -S; ip6tables -w 10 -S")


def test_a_second_stack_on_the_same_hosts_opens_no_port_of_either(stack: Stack) -> None:
    """Two deployments' guards on one host: each keeps its own chain under the shared parent,
    neither rebuilds its chain once both hold (two guards that fought for INPUT's first rule
    flushed theirs on every pass, their ports open meanwhile), the LAN reaches nothing but SSH
    and the two endpoints, and the second stack's destroy leaves the first's rules whole. The
    first stack serves throughout (0 failed requests)."""
    lab = stack.lab
    head = lab.spec.host_mgmt_ip(0)
    second = RealMocks()
    with RequestLoop(stack.endpoint, SERVED_NAME) as loop:
        try:
            started = time.monotonic()
            deploy(lab, second, second_stack(lab), stack=SECOND_STACK)
            record_timing("several models: a second stack on the same hosts, its first up",
                          time.monotonic() - started)  # fmt: skip
            body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4}
            url = f"http://{head}:8100/v1/completions"
            assert attacker.bastion_request(lab, url, "POST", API_KEY, body) == 200
            assert attacker.bastion_request(lab, url, "POST", None, body) == 401
            for host in lab.spec.host_names:
                rules = chains(stack, host).splitlines()
                assert rules.count("-A INPUT -j SPARK-VLLM") == 2, rules  # IPv4 and IPv6
                assert len([r for r in rules if r.startswith("-A SPARK-VLLM -j ")]) == 4, rules
            guards = [(host, prefix) for host in lab.spec.host_names
                      for prefix in (PREFIX, SECOND_PREFIX)]  # fmt: skip
            settled = {guard: guard_log(stack, *guard) for guard in guards}
            time.sleep(25)  # two of the guards' passes (10 s)
            for guard, before in settled.items():
                assert "applying it again" not in guard_log(stack, *guard)[len(before) :], guard
            hosts = tuple(lab.spec.host_names)
            attacker.assert_the_lan_reaches_only_ssh_and_the_endpoint(lab, hosts, 8000, 8100)
        finally:
            second.teardown()
        for host in lab.spec.host_names:
            rules = chains(stack, host).splitlines()
            first = [r for r in rules if r.startswith("-A SPARK-VLLM -j ")]
            assert len(first) == 2, rules  # the first stack's, IPv4 and IPv6
        attacker.assert_the_lan_reaches_only_ssh_and_the_endpoint(
            lab, tuple(lab.spec.host_names), 8000
        )
    record_figure("several models: a second stack up and down beside", loop.summary())
    assert loop.sent > 10 and loop.failures == [], loop.summary()


def guard_log(stack: Stack, host: str, prefix: str) -> str:
    return host_sh(stack.lab, host, f"docker logs {prefix}-firewall 2>&1")
