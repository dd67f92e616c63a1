"""The Ray watch (components/scripts/ray_watch.py) against a real local Ray head: a node the
GCS lists alive is left alone, a node it does not list is restarted after N checks, a GCS that
does not answer changes nothing, and neither does a raylet stopped on purpose. Short intervals
through the watch's own flags; the whole module runs in about half a minute."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import clean_env, free_port, kill_session, session_members

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "ray_watch.py"
sys.path.insert(0, str(SCRIPT.parent))
import ray_watch  # noqa: E402

UNASSIGNED_IP = "192.0.2.123"  # TEST-NET-1: never a Ray node here
ABSENT_CHECKS = 3
INTERVAL_S = 0.5
FAST = [f"--interval-seconds={INTERVAL_S}", "--check-seconds=2", f"--absent-checks={ABSENT_CHECKS}"]
# Long enough for every check the watch would need to act, and two more.
SEVERAL_CHECKS_S = (ABSENT_CHECKS + 2) * INTERVAL_S + 1
STARTUP_TIMEOUT_S = 90


@dataclass
class Watched:
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log:
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.log}"
            assert self.process.poll() is None, f"the watch exited:\n{self.log}"
            time.sleep(0.2)

    def ray_pid(self) -> int:
        """`ray start`, the watch's child (and its process group's leader)."""
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def stop(self) -> int:
        """docker stop: SIGTERM to the watch."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(40)


def watch(
    python: Path, env: dict[str, str], log_path: Path, flags: list[str], command: list[str]
) -> Watched:
    process = subprocess.Popen(
        [str(python), str(SCRIPT), *flags, "--", *command],
        env=env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return Watched(process, log_path)


def node_ip(standin_bin: Path, env: dict[str, str]) -> str:
    """The address Ray picks for this machine (what a fabric IP is on a Spark)."""
    pick = "import ray.util; print(ray.util.get_node_ip_address())"
    done = subprocess.run(
        [str(standin_bin / "python"), "-c", pick], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


@dataclass
class Head:
    watched: Watched
    port: int
    ip: str


@pytest.fixture(scope="module")
def head(standin_bin: Path, ray_hf_home: Path) -> Iterator[Head]:
    """A real `ray start --head --block` under the watch, as the head's container runs it."""
    env = clean_env(standin_bin, ray_hf_home)
    port, ip = free_port(), node_ip(standin_bin, env)
    # Short path: Ray's unix socket paths must stay under 107 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix="rw", dir="/tmp"))
    ray_start = [
        str(standin_bin / "ray"), "start", "--head", "--block", f"--node-ip-address={ip}",
        f"--port={port}", "--num-cpus=1", "--num-gpus=0", "--disable-usage-stats",
        "--include-dashboard=false", "--object-store-memory=100000000", f"--temp-dir={temp_dir}",
    ]  # fmt: skip
    # A raylet registers a few seconds after it starts on this loaded 2-core machine (over 2 s
    # was seen): the grace covers it, as 60 s does on a Spark.
    flags = [f"--gcs=127.0.0.1:{port}", f"--node-ip={ip}", "--grace-seconds=6", *FAST]
    watched = watch(standin_bin / "python", env, temp_dir / "watch.log", flags, ray_start)
    ray_pid: int | None = None
    try:
        watched.wait_for("spark-vllm ray-watch: this node's raylet started", STARTUP_TIMEOUT_S)
        ray_pid = watched.ray_pid()
        watched.wait_for(f"lists this node ({ip}) as alive", STARTUP_TIMEOUT_S)
        yield Head(watched, port, ip)
    finally:
        if ray_pid is not None:
            kill_session(ray_pid)
        kill_session(watched.process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            watched.process.wait(10)
        shutil.rmtree(temp_dir, ignore_errors=True)


def fake_raylet(tmp_path: Path) -> list[str]:
    """A process the watch takes for this node's raylet (a `sleep` named raylet), running but
    registered nowhere: what a stale raylet is to the GCS."""
    raylet = tmp_path / "raylet"
    raylet.write_bytes(Path("/bin/sleep").read_bytes())
    raylet.chmod(0o755)
    return [str(raylet), "120"]


def test_a_node_the_gcs_lists_alive_is_left_alone(head: Head) -> None:
    time.sleep(SEVERAL_CHECKS_S)
    assert head.watched.process.poll() is None, head.watched.log
    assert "stopping this node's Ray" not in head.watched.log
    assert "answers but lists no alive node" not in head.watched.log


def test_a_node_the_gcs_answers_without_is_restarted_after_n_checks(
    head: Head, standin_bin: Path, ray_hf_home: Path, tmp_path: Path
) -> None:
    env = clean_env(standin_bin, ray_hf_home)
    flags = [f"--gcs=127.0.0.1:{head.port}", f"--node-ip={UNASSIGNED_IP}", "--grace-seconds=0.5"]
    stale = watch(standin_bin / "python", env, tmp_path / "watch.log", flags + FAST,
                  fake_raylet(tmp_path))  # fmt: skip
    raylet = stale.ray_pid() if _wait_child(stale) else None
    assert stale.process.wait(40) == ray_watch.RESTART_EXIT, stale.log
    log = stale.log
    assert f"answers but lists no alive node at {UNASSIGNED_IP}" in log
    assert (
        f"spark-vllm ray-watch: the head's GCS at 127.0.0.1:{head.port} answered "
        f"{ABSENT_CHECKS} checks in a row ({INTERVAL_S:g}s apart) without this node "
        f"({UNASSIGNED_IP}) alive, while its raylet runs: stopping this node's Ray and exiting 1"
    ) in log
    assert log.count("stopping this node's Ray") == 1
    assert raylet is not None and session_members(raylet) == []  # its Ray is gone with it
    assert head.watched.process.poll() is None  # the head's own watch saw nothing wrong


def _wait_child(watched: Watched, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    pid = watched.process.pid
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                return True
        time.sleep(0.05)
    return False


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers: a GCS that
    hangs. The client's own wait is 40 s or more; each check must end within its bound."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield int(listener.getsockname()[1])


@pytest.mark.parametrize("gcs", ["closed", "silent"])
def test_a_gcs_that_does_not_answer_changes_nothing(
    gcs: str, silent_port: int, standin_bin: Path, ray_hf_home: Path, tmp_path: Path
) -> None:
    port = silent_port if gcs == "silent" else free_port()
    env = clean_env(standin_bin, ray_hf_home)
    # Each check bounded by 0.5 s: every one ends within a step of 1 s, the GCS hanging or not.
    flags = [
        f"--gcs=127.0.0.1:{port}", f"--node-ip={UNASSIGNED_IP}", "--grace-seconds=0.5",
        f"--interval-seconds={INTERVAL_S}", "--check-seconds=0.5",
        f"--absent-checks={ABSENT_CHECKS}",
    ]  # fmt: skip
    away = watch(standin_bin / "python", env, tmp_path / "watch.log", flags, fake_raylet(tmp_path))
    away.wait_for(f"the head's GCS at 127.0.0.1:{port} did not answer", 30)
    started = time.monotonic()
    time.sleep((ABSENT_CHECKS + 1) * (INTERVAL_S + 0.5))  # more checks than would act
    assert away.process.poll() is None, away.log
    # docker stop: passed on to `ray start` (here the stand-in raylet), its code kept, at once
    # even with a question to the GCS still in flight.
    assert away.stop() == 128 + signal.SIGTERM
    assert time.monotonic() - started < (ABSENT_CHECKS + 1) * (INTERVAL_S + 0.5) + 5
    log = away.log
    assert "stopping this node's Ray" not in log and "answers but" not in log
    why = "no answer within 0.5s" if gcs == "silent" else "its port refuses or does not answer"
    assert why in log


def test_ray_stop_takes_the_raylet_and_not_the_watch(head: Head, standin_bin: Path) -> None:
    """`ray stop` (ray_probe.py's, on a host leaving the stack) picks its victims by name, with
    Ray's own list and rules (scripts.py `stop`): it must find this node's raylet, never the
    watch, whose end would end the container and let Docker bring the host back."""
    listing = "import json; from ray.autoscaler._private.constants import RAY_PROCESSES as p; "
    done = subprocess.run(
        [str(standin_bin / "python"), "-c", listing + "print(json.dumps(p))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    keywords = json.loads(done.stdout.strip().splitlines()[-1])

    def ray_stop_picks(pid: int) -> bool:
        name = _name(pid)
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        return any(
            keyword in (name if by_name else subprocess.list2cmdline(args))
            for keyword, by_name in keywords
        )

    raylets = [p for p in session_members(head.watched.ray_pid()) if _name(p) == "raylet"]
    assert raylets and all(ray_stop_picks(pid) for pid in raylets)
    assert not ray_stop_picks(head.watched.process.pid)


def test_a_raylet_stopped_on_purpose_is_not_restarted_and_docker_stop_ends_all(
    head: Head,
) -> None:
    """`ray stop` (ray_probe.py, for a host leaving the stack) ends the raylet with SIGTERM and
    leaves `ray start --block` waiting; the GCS then lists the node dead. The watch must not
    bring it back. Last in the module: it stops the head."""
    watched = head.watched
    group = watched.ray_pid()
    raylets = [pid for pid in session_members(group) if _name(pid) == "raylet"]
    assert len(raylets) == 1, session_members(group)
    os.kill(raylets[0], signal.SIGTERM)  # this test's own Ray's raylet, by its id
    watched.wait_for("this node's raylet is not running", 30)
    time.sleep(SEVERAL_CHECKS_S)
    assert watched.process.poll() is None, watched.log
    assert "stopping this node's Ray" not in watched.log
    # `ray start` exits 1 on SIGTERM (Ray 2.60 node.py: its handler ends with sys.exit(1));
    # the watch keeps that code and leaves no process of this node's Ray behind.
    assert watched.stop() == 1, watched.log
    assert session_members(group) == []


def _name(pid: int) -> str:
    try:
        return ray_watch.parse_stat(Path(f"/proc/{pid}/stat").read_text())[0]
    except OSError:
        return ""
