"""monitoring_ready.py (the `monitoring-ready` step) against a real Prometheus (Debian's, as the
lab installs it): it waits until every target is scraped and up, prints a line per job, and
fails naming a target still down and Prometheus's own error for it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.program.ports import free_port
from tests.program.prometheus import running_prometheus

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "monitoring_ready.py"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """Prometheus scraping itself (job `self`) and a port nothing listens on (job `gone`)."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package (lab/install-deps.sh) is not installed"
    port, closed = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: self\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        f"  - job_name: gone\n    static_configs:\n      - targets: ['127.0.0.1:{closed}']\n"
    )
    with running_prometheus(binary, config, port, tmp_path):
        yield f"127.0.0.1:{port}", closed


def ready(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--host", "spark1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_target_down_at_the_deadline_is_named_with_its_error(prometheus: tuple[str, int]) -> None:
    address, _ = prometheus
    # Only `self` is asked for, but every active target must be up: `gone` is not.
    # Prometheus takes its targets about 5 s after it starts (its scrape manager's reload).
    done = ready("--prometheus", address, "--jobs", "self", "--timeout-seconds", "12")
    assert done.returncode == 1
    assert "spark-vllm: spark1: monitoring-ready: targets not up after 12 s" in done.stderr
    assert "gone http://127.0.0.1:" in done.stderr
    assert "connection refused" in done.stderr
    assert "likely cause:" in done.stderr


def test_a_target_that_comes_up_in_time_passes(
    prometheus: tuple[str, int],
) -> None:
    address, closed = prometheus
    with socket.socket() as listener:  # `gone` answers /metrics from now on
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", closed))
        listener.listen()
        stop = time.monotonic() + 20
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE_METRICS, str(listener.fileno()), str(stop)],
            pass_fds=(listener.fileno(),),
        )
        try:
            done = ready("--prometheus", address, "--jobs", "self,gone", "--timeout-seconds", "15")
        finally:
            server.kill()
            server.wait()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "monitoring: self: 1 of 1 targets up",
        "monitoring: gone: 1 of 1 targets up",
    ]


def test_an_optional_job_down_is_reported_not_failed(prometheus: tuple[str, int]) -> None:
    address, _ = prometheus
    done = ready("--prometheus", address, "--jobs", "self,gone", "--optional-jobs", "gone",
                 "--timeout-seconds", "15")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "monitoring: self: 1 of 1 targets up",
        "monitoring: gone: 0 of 1 targets up",
    ]
    assert "is down" in lines[2] and "connection refused" in lines[2] and "not required" in lines[2]


def test_a_prometheus_that_never_answers_is_named(tmp_path: Path) -> None:
    done = ready("--prometheus", f"127.0.0.1:{free_port()}", "--jobs", "vllm",
                 "--timeout-seconds", "3")  # fmt: skip
    assert done.returncode == 1
    assert "Prometheus at 127.0.0.1:" in done.stderr and "did not answer within 3 s" in done.stderr


# A minimal /metrics on an inherited socket, until a deadline.
SERVE_METRICS = """
import http.server, socket, sys, time
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"up_test 1\\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
server.socket = socket.socket(fileno=int(sys.argv[1]))
server.timeout = 0.5
while time.monotonic() < float(sys.argv[2]):
    server.handle_request()
"""
