"""vllm-ready.sh against a Docker CLI stand-in and a real listener on loopback: the readiness
wait's cold-start figures (port open, /health, first token, from the container's start), its
exit status once ready, and a stop by the memory guard named as the failure. The lab runs it
against real servers (tests/lab/test_e2e.py, test_memory_faults.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stacks.plan.cold_start import start_figures
from tests.program.scripting import SCRIPTS, fake_bin

# The container started 1 s after it was created; the probe answers `starting` until the file
# `ready` exists, then `ready`; `stopped` makes the container exited. The guard's log names
# this container's ID when `guard` exists.
FAKE_DOCKER = """#!/usr/bin/env bash
state="$STATE_DIR"
case "$1" in
  inspect)
    format="$3"
    case "$format" in
      *Created*) echo "$CREATED $STARTED" ;;
      *RestartCount*State.Status*) [ -e "$state/stopped" ] && echo "0 exited" || echo "0 running" ;;
      *RestartCount*) echo 0 ;;
      *State.Status*) [ -e "$state/stopped" ] && echo exited || echo running ;;
      *.Id*) echo "4f2a9c1b7d3e$(printf '0%.0s' $(seq 52))" ;;
      *) echo "running (exit 0, restarts 0, oom false)" ;;
    esac ;;
  exec)
    cat >/dev/null
    if [ -e "$state/ready" ]; then echo 'ready "hello"'; else echo 'starting /health=503'; fi ;;
  logs)
    if [ -e "$state/guard" ]; then
      echo "spark-vllm: spark1: memory-guard: stopped spark-vllm-vllm (id 4f2a9c1b7d3e, vllm, started 5s before) at T: 0.9 GiB of 23.4 GiB available, below the guard's 1.0 GiB"
      echo "  likely cause: the server takes more memory than this node has while it starts"
    fi ;;
esac
"""  # noqa: E501


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


@pytest.fixture
def free_port() -> int:
    """A loopback port nothing listens on (bound once to find it, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait(tmp_path: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    now = time.time()
    env = {
        **os.environ,
        **fake_bin(tmp_path, docker=FAKE_DOCKER),
        "STATE_DIR": str(state),
        "CREATED": rfc3339(now - 1),
        "STARTED": rfc3339(now),
    }
    argv = ["bash", str(SCRIPTS / "vllm-ready.sh"), "--host", "spark1",
            "--container", "spark-vllm-vllm", "--container-scripts", "/spark-vllm/bin",
            "--port", "8000", "--served-name", "m", "--timeout-seconds", "30",
            "--progress-seconds", "30", "--measure-completions", "0",
            "--expect-transport", "none", "--executor", "mp", "--nodes",
            "spark1|-|spark-vllm-vllm", "--server-address", "127.0.0.1",
            "--server-port", str(port), *extra]  # fmt: skip
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def test_the_start_is_timed_from_the_containers_start_and_the_wait_succeeds(
    tmp_path: Path, free_port: int
) -> None:
    """The port opens 1.5 s after the start, the server answers 3 s after: the figures say
    so (to the probe's 2 s), and the step exits 0 (its watcher killed on the way out)."""
    started = time.monotonic()
    waiting = wait(tmp_path, free_port)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def open_then_ready() -> None:
        time.sleep(1.5)
        listener.bind(("127.0.0.1", free_port))
        listener.listen()
        time.sleep(1.5)
        (tmp_path / "state" / "ready").touch()

    threading.Thread(target=open_then_ready, daemon=True).start()
    out, err = waiting.communicate("key\n", timeout=60)
    listener.close()
    assert waiting.returncode == 0, err
    figures = start_figures(out)
    assert figures["containerStartSeconds"] == pytest.approx(1.0, abs=0.2), out
    assert 1.2 < figures["portOpenSeconds"] < 2.5, out  # type: ignore[operator]
    assert 3.0 <= figures["healthSeconds"] <= 6.0, out  # type: ignore[operator]
    assert figures["firstTokenSeconds"] == figures["healthSeconds"]
    assert time.monotonic() - started < 15


def test_a_server_ready_at_the_first_probe_is_no_cold_start(tmp_path: Path, free_port: int) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "ready").touch()
    waiting = wait(tmp_path, free_port)
    out, err = waiting.communicate("key\n", timeout=60)
    assert waiting.returncode == 0, err
    assert 'spark-vllm-start {"measured":false}' in out
    assert set(start_figures(out).values()) == {None}


def test_a_stop_by_the_memory_guard_is_the_failure(tmp_path: Path, free_port: int) -> None:
    (tmp_path / "state").mkdir()
    for name in ("stopped", "guard"):
        (tmp_path / "state" / name).touch()
    waiting = wait(tmp_path, free_port, "--guard-container", "spark-vllm-memory-guard")
    out, err = waiting.communicate("key\n", timeout=60)
    assert waiting.returncode == 1, (out, err)
    assert (
        "spark-vllm: spark1: vllm-ready: spark1: memory-guard: stopped spark-vllm-vllm (id "
        "4f2a9c1b7d3e, vllm, started 5s before) at T: 0.9 GiB of 23.4 GiB available, below the "
        "guard's 1.0 GiB\n  likely cause: the server takes more memory than this node has "
        "while it starts\n"
    ) in err, err
    assert json.dumps({}) not in out
