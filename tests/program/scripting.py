"""The host scripts as the tests run them: with bash, as modules imported the way a host imports
them, and with stand-ins for the tools they call (docker, ssh, ...)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[2] / "components" / "scripts"


def run(script: str, *args: str, stdin: str = "", env: dict[str, str] | None = None,
        check: bool = False) -> subprocess.CompletedProcess[str]:  # fmt: skip
    done = subprocess.run(
        ["bash", str(SCRIPTS / script), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def fake_docker_path(tmp_path: Path, script: str) -> str:
    """A PATH whose `docker` is `script` (a stand-in for the Docker CLI the scripts call)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(script)
    (bin_dir / "docker").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def load(name: str) -> ModuleType:
    """A host script as a module; its siblings import as they do on a host, where `python3
    DIR/x.py` puts DIR first on sys.path."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass looks its module up while it is made
    spec.loader.exec_module(module)
    return module


# Stands in for ssh (the relay chain's tests run relay.sh): runs the remote command with bash
# here, as the login shell on the far end would; a destination named in $DOWN fails at once, as
# an unreachable host does.
FAKE_SSH = """#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case "$1" in -o|-i|-c) shift 2 ;; -A|-n|-T) shift ;; *) break ;; esac
done
dest=$1; shift
case " ${DOWN:-} " in
  *" $dest "*) echo "ssh: connect to $dest: Connection timed out" >&2; exit 255 ;;
esac
exec bash -c "$*"
"""


def fake_bin(tmp_path: Path, **tools: str) -> dict[str, str]:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def watch(stall: float = 0, progress: float = 1, seconds: float = 60) -> Any:
    """What a copy watches for (copy_pump.py Watch): stalls, progress, its deadline."""
    return load("copy_pump").Watch(
        label="spark2",
        what="image",
        progress_seconds=progress,
        stall_seconds=stall,
        deadline=time.monotonic() + seconds,
    )


def make_handover_pair(path: Path) -> None:
    """The front's handover key pair at `path`, made as the head's step makes it
    (front-keys-file.sh), for a front run here."""
    work = path.parent / ".handover-pair"
    run("front-keys-file.sh", "write", "--host", "h", "--file", str(work / "keys.map"),
        stdin="operator\n", check=True)  # fmt: skip
    (work / "handover.pem").rename(path)
    run("front-keys-file.sh", "remove", "--host", "h", "--file", str(work / "keys.map"),
        check=True)  # fmt: skip
