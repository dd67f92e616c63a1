"""The front as a router (stacks/plan/front.py router_config), run for real: HAProxy (Debian's
2.6, as in the lab image) before three vLLM stand-ins, two replicas of one model and a second
model. Every request needs the key; each goes to its model's servers by the body's `model`;
replicas are balanced and one that dies costs no request; a model with no server up answers
503 naming it while the other serves; a big body is routed by its `model` or refused."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacks.plan.front import BODY_BUFFER_BYTES, Route, models_document, router_config
from stacks.plan.front_body import BODY_LUA

from .conftest import unavailable
from .helpers import TINY_MODEL, StandinFactory, StandinProcess, free_port, http

KEY = "router-test-key"


class Haproxy:
    def __init__(self, routes: list[Route], workdir: Path) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            unavailable("Debian's haproxy package (lab/install-deps.sh) is not installed")
        self.port, self.metrics_port = free_port(), free_port()
        bearer, models = workdir / "bearer", workdir / "models.json"
        bearer.write_text(f"Bearer {KEY}\n")
        models.write_text(models_document(routes))
        body_lua = workdir / "body.lua"
        body_lua.write_text(BODY_LUA)
        config = workdir / "haproxy.cfg"
        metrics = f"127.0.0.1:{self.metrics_port}"
        config.write_text(
            router_config(
                f"127.0.0.1:{self.port}",
                str(bearer),
                routes,
                str(models),
                metrics,
                body_lua=str(body_lua),
            )
        )
        check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = workdir / "haproxy.log"
        self.process = subprocess.Popen(
            [binary, "-db", "-f", str(config)], stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def complete(url: str, model: str, key: str | None = KEY, **extra: object) -> tuple[int, dict]:
    body = {"prompt": "hello there", "max_tokens": 4, **extra, "model": model}  # model last
    status, raw = http("POST", f"{url}/v1/completions", body, api_key=key)
    return status, json.loads(raw or b"{}")


def answered(server: StandinProcess) -> float:
    status, raw = http("GET", f"{server.base_url}/metrics")
    assert status == 200
    match = re.search(r"^vllm:request_success_total\{[^}]*\} (\S+)$", raw.decode(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def serves(url: str) -> bool:
    try:
        return complete(url, "alpha")[0] == 200
    except OSError:  # not listening yet
        return False


@pytest.fixture
def fleet(
    standin: StandinFactory, tmp_path: Path
) -> Iterator[tuple[Haproxy, list[StandinProcess], StandinProcess]]:
    args = ("--max-model-len", "1024")
    alphas = [standin(TINY_MODEL, "--served-model-name", "alpha", *args) for _ in range(2)]
    beta = standin(TINY_MODEL, "--served-model-name", "beta", *args)
    for server in (*alphas, beta):
        server.wait_ready(timeout_s=60)
    routes = [
        Route("alpha", TINY_MODEL, 1024,
              tuple((f"alpha{i}", f"127.0.0.1:{s.port}") for i, s in enumerate(alphas))),
        Route("beta", TINY_MODEL, 1024, (("beta", f"127.0.0.1:{beta.port}"),)),
    ]  # fmt: skip
    front = Haproxy(routes, tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not serves(front.url):
            assert time.monotonic() < deadline, front.log.read_text()[-2000:]
            time.sleep(0.2)
        yield front, alphas, beta
    finally:
        front.stop()


def test_one_endpoint_routes_each_model_to_its_servers(
    fleet: tuple[Haproxy, list[StandinProcess], StandinProcess],
) -> None:
    front, alphas, beta = fleet
    url = front.url
    # The key on every path, the front's own list of models, and each model to its servers.
    for method, path in (("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"),
                         ("POST", "/v1/completions"), ("GET", "/nowhere")):  # fmt: skip
        status, raw = http(method, f"{url}{path}", {} if method == "POST" else None)
        assert (status, json.loads(raw)) == (401, {"error": "Unauthorized"}), (method, path)
    status, raw = http("GET", f"{url}/v1/models", api_key=KEY)
    assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == ["alpha", "beta"]
    for _ in range(10):
        status, reply = complete(url, "alpha")
        assert status == 200 and reply["model"] == "alpha", reply
    assert all(answered(server) > 0 for server in alphas), "replicas are balanced"
    status, reply = complete(url, "beta", stream=False)
    assert status == 200 and reply["model"] == "beta" and answered(beta) == 1
    status, raw = http("POST", f"{url}/v1/completions",
                       {"model": "beta", "prompt": "hi", "max_tokens": 3, "stream": True},
                       api_key=KEY)  # fmt: skip
    events = [line for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "data: [DONE]" and len(events) == 4, events
    status, reply = complete(url, "gamma")
    assert status == 404 and reply["error"]["message"] == "The model `gamma` does not exist."

    # A body the front reads whole is routed by its `model` wherever it stands; past the
    # front's buffer, without `model` in what it read, it is refused rather than misrouted.
    padding = "x" * 300_000
    status, reply = complete(url, "beta", user=padding)
    assert status == 200 and reply["model"] == "beta", reply
    status, reply = complete(url, "beta", user="x" * (BODY_BUFFER_BYTES + 100_000))
    assert status == 413 and "put `model` first" in reply["error"]["message"], reply

    # A replica dies: no request to its model fails.
    alphas[0].stop()
    failed = [status for status, _ in (complete(url, "alpha") for _ in range(10)) if status != 200]
    assert failed == []
    # Every server of a model down: it answers 503 naming it; the other model serves.
    beta.stop()
    deadline = time.monotonic() + 10
    while (down := complete(url, "beta"))[0] != 503:
        assert time.monotonic() < deadline, down
        time.sleep(0.5)
    assert down[1]["error"]["message"] in (
        "The model `beta` has no server up",
        "The model `beta` is unavailable",
    ), down
    assert complete(url, "alpha")[0] == 200

    # The router's own metrics (HAProxy's Prometheus exporter) on its loopback port, without
    # the key (the port is never published): requests per backend, one backend per model.
    status, raw = http("GET", f"http://127.0.0.1:{front.metrics_port}/metrics")
    assert status == 200, raw[:300]
    text = raw.decode()
    served = re.findall(
        r'^haproxy_backend_http_responses_total\{proxy="model_(\d)",code="2xx"\} (\S+)$',
        text,
        re.MULTILINE,
    )
    assert {index for index, count in served if float(count) > 0} == {"0", "1"}, served
