"""The stand-in's /metrics, as vLLM names them, filled by its own serving; scraped by a real
Prometheus (Debian's, lab/install-deps.sh); and every query of the dashboard spark-vllm ships
(components/dashboards/) answered with series of the served model."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standin.dashboards import dashboard_queries

from .conftest import unavailable
from .helpers import TINY_MODEL, StandinFactory, free_port, http

REPO = Path(__file__).resolve().parents[2]
SERVED = "tiny"
NODE = "standin-node"
SCRAPE_SECONDS = 1
RATE_WINDOW = "15s"  # what Grafana's $__rate_interval is at this scrape interval (4 scrapes)
# A prompt of two full KV blocks (16 words each): the second time, both are prefix-cache hits.
SHARED_PROMPT = " ".join(f"word{i}" for i in range(40))


def as_grafana_runs(expr: str) -> str:
    """The query Grafana sends: its variables replaced (the model picked, the rate window)."""
    return expr.replace("$model_name", SERVED).replace("$__rate_interval", RATE_WINDOW)


class Prometheus:
    def __init__(self, target: str, workdir: Path, node_target: str | None = None) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            unavailable("Debian's prometheus package (lab/install-deps.sh) is not installed")
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_SECONDS}s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
            f"      - targets: ['{target}']\n"
        )
        if node_target is not None:  # as the stack's scrape config labels each node
            with config.open("a") as text:
                text.write(
                    "  - job_name: node\n    static_configs:\n"
                    f"      - targets: ['{node_target}']\n        labels: {{node: {NODE}}}\n"
                )
        self.log = workdir / "prometheus.log"
        argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}"]  # fmt: skip
        self.process = subprocess.Popen(
            argv,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        status, body = http("GET", url)
        assert status == 200, (url, body[:500])
        return json.loads(body)

    def query(self, expr: str) -> list[dict]:
        answer = self.api("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                if http("GET", f"http://127.0.0.1:{self.port}/-/ready", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def serving(standin: StandinFactory, tmp_path: Path) -> Iterator[tuple[str, Prometheus]]:
    """A stand-in under a steady load of completions, streamed and not, some sharing a prefix;
    a Prometheus scraping it every second."""
    server = standin(TINY_MODEL, "--served-model-name", SERVED, "--max-model-len", "1024")
    server.wait_ready(timeout_s=60)
    exporter = shutil.which("prometheus-node-exporter")
    if exporter is None:
        unavailable("Debian's prometheus-node-exporter (lab/install-deps.sh) is not installed")
    node_port = free_port()
    node = subprocess.Popen(
        [exporter, f"--web.listen-address=127.0.0.1:{node_port}", "--collector.disable-defaults",
         "--collector.meminfo"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    prometheus = Prometheus(f"127.0.0.1:{server.port}", tmp_path, f"127.0.0.1:{node_port}")
    stop = threading.Event()

    def load() -> None:
        for turn in range(10_000):
            if stop.is_set():
                return
            body = {"model": SERVED, "prompt": SHARED_PROMPT if turn % 2 else f"hello {turn}",
                    "max_tokens": 8, "stream": turn % 3 == 0}  # fmt: skip
            http("POST", f"{server.base_url}/v1/completions", body)
            time.sleep(0.05)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        prometheus.wait_ready()
        yield server.base_url, prometheus
    finally:
        stop.set()
        loader.join(timeout=10)
        prometheus.stop()
        node.terminate()
        node.wait(timeout=10)


def wait_for_samples(prometheus: Prometheus, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = prometheus.query(f"count_over_time(vllm:num_requests_running[{RATE_WINDOW}])")
        if found and float(found[0]["value"][1]) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} scrapes in {timeout_s:.0f} s")


def test_the_metrics_are_vllms_names_filled_by_serving(
    serving: tuple[str, Prometheus],
) -> None:
    base_url, _ = serving
    time.sleep(1)  # a few requests answered
    status, body = http("GET", f"{base_url}/metrics")
    assert status == 200
    text = body.decode()
    labels = f'model_name="{SERVED}",engine="0"'

    def value(sample: str) -> float:
        match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
        assert match, f"{sample} missing from /metrics:\n{text[:3000]}"
        return float(match.group(1))

    answered = value(f'vllm:request_success_total{{{labels},finished_reason="length"}}')
    assert answered >= 2
    assert value(f"vllm:generation_tokens_total{{{labels}}}") == 8 * answered
    assert value(f"vllm:time_to_first_token_seconds_count{{{labels}}}") == answered
    assert value(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}}') == answered
    # Seven gaps between eight tokens, in each answered request.
    assert value(f"vllm:inter_token_latency_seconds_count{{{labels}}}") == 7 * answered
    # The shared prompt's two full blocks are hits from its second request on.
    assert value(f"vllm:prefix_cache_hits_total{{{labels}}}") >= 32
    assert value(f"vllm:prefix_cache_queries_total{{{labels}}}") > value(
        f"vllm:prefix_cache_hits_total{{{labels}}}"
    )
    assert 0 <= value(f"vllm:kv_cache_usage_perc{{{labels}}}") <= 1
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in text


def test_every_dashboard_query_returns_series_for_the_served_model(
    serving: tuple[str, Prometheus],
) -> None:
    _, prometheus = serving
    queries = dashboard_queries()
    # Ten panels: the latencies at three quantiles each, each node's memory in use and available.
    assert len(queries) >= 17, queries
    wait_for_samples(prometheus, count=6)
    targets = prometheus.api("/api/v1/targets")["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up", "up"], targets
    empty = []
    for title, expr in queries:
        result = prometheus.query(as_grafana_runs(expr))
        if not result:
            empty.append(title)
            continue
        for series in result:
            label, value = ("model_name", SERVED) if "$model_name" in expr else ("node", NODE)
            assert series["metric"].get(label) == value, (title, series)
            assert not math.isnan(float(series["value"][1])), (title, series)
    assert empty == [], f"queries without series: {empty}"
