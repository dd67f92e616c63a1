"""A Docker registry on one simulated host's loopback, for what only a registry gives an image:
a repo digest (`repo@sha256:...`, set by a push or a pull, never by `docker load`).

Debian's `docker-registry` (the CNCF distribution registry 2.8, lab/install-deps.sh) runs on
this machine in the host's network namespace, so the host's dockerd reaches it at
127.0.0.1:<port>; Docker talks plain HTTP to a registry on 127.0.0.0/8 without any
insecure-registries setting (moby registry/config.go, loopback is always insecure)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from lab import Lab
from lab.net import NETNS_DIR

PORT = 5000

CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@contextlib.contextmanager
def registry_on(lab: Lab, host: str, workdir: Path, timeout: float = 30) -> Iterator[str]:
    """Serve a registry on `host`'s loopback while the block runs; yields `127.0.0.1:<port>`."""
    root = workdir / "registry"
    root.mkdir(parents=True, exist_ok=True)
    config = workdir / "registry.yml"
    config.write_text(CONFIG.format(root=root, port=PORT))
    log = (workdir / "registry.log").open("ab")
    netns = NETNS_DIR / lab.node(host).netns
    proc = subprocess.Popen(
        ["nsenter", f"--net={netns}", "--", "docker-registry", "serve", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    address = f"127.0.0.1:{PORT}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            probe = lab.sh(host, f"curl -fsS http://{address}/v2/ >/dev/null", check=False)
            if probe.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{host}: the registry did not answer on {address}: "
                    + (workdir / "registry.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
