"""`python -m lab monitor`: the lab's Prometheus (a stack deployed with monitoring on, e.g.
`monitoring: {enabled: true}` in Pulumi.lab.yaml with the lab's images, as
tests/lab/test_several_models.py deploys it) in your browser, through the same SSH tunnel a
user opens to the head; with `--screenshot FILE`, a real headless browser (Debian's chromium)
saves the serving graph as a PNG and the tunnel closes."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from lab import client
from lab.core import Lab
from lab.proc import LabError

PROMETHEUS_PORT = 9090  # monitoring.prometheus.port's default, on the head's loopback
# Output tokens/s per model: the graph a newcomer looks at first.
SERVING_QUERY = "sum by (model_name) (rate(vllm:generation_tokens_total[30s]))"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def tunnel(lab: Lab, local_port: int, remote_port: int = PROMETHEUS_PORT) -> Iterator[str]:
    """`ssh -L` to the head's loopback (through the bastion, as the stack's `monitoring` output
    prints it); yields the local base URL."""
    info = lab.info()
    forward = ["-N", "-o", "ExitOnForwardFailure=yes",
               "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}"]  # fmt: skip
    argv = client.ssh_argv(info, info.head, "", multiplex=False, extra_options=forward)[:-2]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", local_port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"the tunnel to {info.head.name}:{remote_port} did not open")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{local_port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def graph_url(base: str, query: str = SERVING_QUERY, minutes: int = 5) -> str:
    """Prometheus's graph page showing `query` over the last `minutes`."""
    params = {"g0.expr": query, "g0.tab": "0", "g0.range_input": f"{minutes}m"}
    return f"{base}/graph?{urllib.parse.urlencode(params)}"


def screenshot(url: str, out: Path, timeout: float = 90) -> None:
    """`url` rendered by headless chromium into `out` (PNG)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise LabError("no chromium on PATH: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                f"--user-data-dir={profile}", "--window-size=1400,900",
                "--virtual-time-budget=8000", f"--screenshot={out}", url]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not out.exists():
        raise LabError(f"chromium could not take the screenshot: {done.stderr[-1500:]}")


def monitor(lab: Lab, port: int, shot: Path | None) -> None:
    with tunnel(lab, port) as base:
        url = graph_url(base)
        if shot is not None:
            screenshot(url, shot)
            print(f"lab monitor: {shot} ({url})")
            return
        print(f"lab monitor: Prometheus at {base} (serving graph: {url}); Ctrl-C closes it")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
