"""A real Prometheus (Debian's, as the lab installs it) on loopback, for the tests that hold a
planned scrape or the readiness step to it."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def running_prometheus(binary: str, config: Path, port: int, logs: Path) -> Iterator[Path]:
    """Prometheus with `config`, listening on 127.0.0.1:`port`, its data and log under `logs`;
    yields once it says it is ready (or after 30 s: the test's own wait names what is missing),
    the log's path, and stops it on the way out."""
    log = logs / "prometheus.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={logs / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        yield log
    finally:
        process.terminate()
        process.wait(timeout=10)
