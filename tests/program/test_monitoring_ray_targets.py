"""monitoring_ray_targets.py: which Ray nodes export metrics, as Prometheus's file service
discovery; a node whose metrics port does not answer is said and left out."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.program.ports import free_port

SCRIPT = (
    Path(__file__).resolve().parents[2] / "components" / "scripts" / "monitoring_ray_targets.py"
)


class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"ray_node_mem_used 1\n"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporting() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_only_the_nodes_that_answer_are_written(exporting: str, tmp_path: Path) -> None:
    silent = f"127.0.0.1:{free_port()}"
    target = tmp_path / "ray-targets.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--host", "spark1", "--file", str(target),
         "--targets", f"{exporting}=spark1,{silent}=spark2", "--timeout-seconds", "3"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(target.read_text()) == [
        {"targets": [exporting], "labels": {"node": "spark1"}}
    ]
    lines = done.stdout.splitlines()
    assert lines[0] == f"monitoring: ray: spark1 ({exporting}) exports metrics: scraped"
    assert lines[1].startswith(f"monitoring: ray: spark2 ({silent}) exports no metrics (")
    assert "not scraped" in lines[1] and "ray[default]" in lines[1]
    assert oct(target.stat().st_mode & 0o777) == "0o644"  # Prometheus (root) reads it anyway
