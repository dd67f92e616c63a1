"""Which Docker engine each lab host runs: Debian 12's 20.10 (installed), or Debian 13's 26.1
(fetched once into the cache, never installed) with the classic store or the containerd image
store, the store Docker 29 makes the default (../shared/LAB-NOTES.md, last section)."""

from __future__ import annotations

import fcntl
import json
import resource
from pathlib import Path
from typing import Literal

from lab.proc import SCRIPTS_DIR, run

Engine = Literal["20.10", "26", "26-containerd"]
ENGINES: tuple[Engine, ...] = ("20.10", "26", "26-containerd")
DEFAULT_ENGINE: Engine = "20.10"
FETCH_TIMEOUT = 600


def fetched_dir(cache_dir: Path, engine: str) -> Path | None:
    """Where an engine's binaries are unpacked (None: the machine's own Docker)."""
    if engine == "20.10":
        return None
    return cache_dir / "engines" / "docker-26"


def uses_containerd_store(engine: str) -> bool:
    return engine == "26-containerd"


def storage_driver(engine: str) -> str:
    """dockerd's --storage-driver: overlay2 for the classic store; none with the containerd store,
    which names a containerd snapshotter there ("overlay2" is not one: runs fail) and defaults
    to overlayfs."""
    return "" if uses_containerd_store(engine) else "overlay2"


# Default ulimits as a tuned GPU host's daemon.json sets them: dockerd merges each into every
# container that does not set it (the program sets `stack`, so its own stays), and the
# provider's read after a create sees the merged set (stacks/plan/containers.py). No higher
# than this machine lets a process raise its own (runc fails "error setting rlimits").
def default_ulimits() -> dict[str, dict[str, object]]:
    limits = {"nofile": resource.RLIMIT_NOFILE, "memlock": resource.RLIMIT_MEMLOCK}
    found: dict[str, dict[str, object]] = {}
    for name, which in limits.items():
        hard = resource.getrlimit(which)[1]
        value = -1 if hard == resource.RLIM_INFINITY else hard
        found[name] = {"Name": name, "Soft": value, "Hard": value}
    found["stack"] = {"Name": "stack", "Soft": 8388608, "Hard": 8388608}
    return found


def daemon_json(engine: str) -> str:
    """The host's /etc/docker/daemon.json: default ulimits on every host; the containerd
    snapshotter is a feature flag in 26."""
    config: dict[str, object] = {"default-ulimits": default_ulimits()}
    if uses_containerd_store(engine):
        config["features"] = {"containerd-snapshotter": True}
    return json.dumps(config) + "\n"


def ensure_fetched(cache_dir: Path, engine: str) -> Path | None:
    """Fetch the engine's packages once (serialized: two labs starting at once fetch once)."""
    target = fetched_dir(cache_dir, engine)
    if target is None or (target / ".complete").exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / "engines.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run(
            ["bash", str(SCRIPTS_DIR / "fetch-engine.sh"), str(target)],
            timeout=FETCH_TIMEOUT,
            what=f"fetch Docker {engine} (Debian 13 packages) into {target}",
        )
    return target
