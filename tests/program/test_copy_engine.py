"""copy_engine.py, the head's copy engine: its transfers run for real (bash pipelines, a stream
that stops moving, one that ends, a deadline), its probe read from the worker script's real
answer, and its relay call taken apart by the workers' own relay.sh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.program.test_scripts import FAKE_SSH, SCRIPTS, load

FIXTURES = Path(__file__).parent / "fixtures" / "inspect"
load("copy_plan")
layers = load("image_layers")
engine = load("copy_engine")


def watch(stall: float = 0, progress: float = 1, seconds: float = 60) -> Any:
    return engine.Watch(
        label="spark2",
        what="image",
        progress_seconds=progress,
        stall_seconds=stall,
        deadline=time.monotonic() + seconds,
    )


def left_running(marker: str) -> str:
    done = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False)
    return done.stdout.strip()


# --- transfer: counted, reported, watched -------------------------------------------------------


def test_a_stream_that_stops_moving_is_stopped_with_both_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """3 MB over ~1 s, then nothing (a worker that stopped reading holds the pipe just so): the
    watchdog stops it after the stall time, both ends' process groups, and says so."""
    source = "head -c 1500000 /dev/zero; sleep 1.2; head -c 1500000 /dev/zero; sleep 301.5"
    sink = "cat >/dev/null; sleep 302.5"
    started = time.monotonic()
    outcome = engine.transfer(source, sink, watch(stall=3), 10_000_000)
    elapsed = time.monotonic() - started
    assert outcome.stalled
    assert outcome.sent == 3_000_000
    assert 3 < elapsed < 20, elapsed
    assert left_running("sleep 30[12].5") == ""
    progress = capsys.readouterr().err.splitlines()
    assert "spark2: image 3 of 10 MB, 0 MB/s, ETA 0 s" in progress or any(
        line.startswith("spark2: image ") and " of 10 MB, " in line for line in progress
    ), progress


def test_a_quiet_while_after_every_byte_went_out_is_the_worker_storing_not_a_stall() -> None:
    """The stream ended; the receiving end takes 4 s more (a `docker load` takes minutes), with
    a 1 s stall time: it runs to its end."""
    outcome = engine.transfer("head -c 2000000 /dev/zero", "cat >/dev/null; sleep 4; echo stored",
                              watch(stall=1), 2_000_000)  # fmt: skip
    assert (outcome.status, outcome.stalled, outcome.sent) == (0, False, 2_000_000)
    assert outcome.output == "stored\n"


def test_a_stream_still_running_at_the_deadline_is_stopped_as_a_timeout() -> None:
    started = time.monotonic()
    outcome = engine.transfer("sleep 303.5", "cat >/dev/null", watch(seconds=2), 1)
    assert outcome.status == 124 and not outcome.stalled
    assert time.monotonic() - started < 12
    assert left_running("sleep 303.5") == ""


@pytest.mark.parametrize(
    ("source", "sink", "status"),
    [
        ("head -c 5000000 /dev/zero", "head -c 10 >/dev/null; exit 3", 3),
        ("exit 4", "cat >/dev/null", 4),
        ("head -c 100 /dev/zero | false", "cat >/dev/null", 1),  # pipefail in each end
    ],
    ids=["sink-fails", "source-fails", "source-pipe-fails"],
)
def test_a_failed_end_gives_the_stream_its_status(source: str, sink: str, status: int) -> None:
    outcome = engine.transfer(source, sink, watch(stall=5), 1)
    assert (outcome.status, outcome.stalled) == (status, False)


# --- the worker's image facts --------------------------------------------------------------------

FAKE_DOCKER = """#!/usr/bin/env bash
case "$*" in
  "image inspect spark-vllm.invalid/image:sha256-abc") cat "$INSPECTED" ;;
  "image inspect --format {{json .RootFS.Layers}} "*)
    printf '%s\\n' '["sha256:aa","sha256:bb"]' '["sha256:cc"]' ;;
  "image inspect "*) echo '[]'; echo "Error: No such image: $3" >&2; exit 1 ;;
  "image ls -q --no-trunc") printf 'sha256:1\\nsha256:2\\nsha256:1\\n' ;;
  *) echo "fake docker: $*" >&2; exit 2 ;;
esac
"""


PINNED = "spark-vllm.invalid/image:sha256-abc"


def probe(tmp_path: Path, inspected: str, staged: dict[str, int]) -> Any:
    """image-probe.sh run for real beside a fake Docker; its answer parsed by the engine."""
    bin_dir = tmp_path / "leaf" / "bin"
    shutil.copytree(SCRIPTS, bin_dir)
    stage = tmp_path / "leaf" / "image-stage" / "abc"
    for name, size in staged.items():
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_bytes(b"x" * size)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "docker").write_text(FAKE_DOCKER)
    (fake / "docker").chmod(0o755)
    (tmp_path / "inspected.json").write_text(inspected)
    done = subprocess.run(
        ["bash", str(bin_dir / "image-probe.sh"), PINNED, "abc", "5"],
        capture_output=True, text=True, timeout=30, check=True,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
             "INSPECTED": str(tmp_path / "inspected.json")},
    )  # fmt: skip
    return engine.parse_image_probe(done.stdout)


def test_the_probe_reads_what_a_worker_holds(tmp_path: Path) -> None:
    inspected = (FIXTURES / "docker-26-containerd.json").read_text()
    facts = probe(tmp_path, inspected, {"blobs/sha256/x": 7, "empty": 0})
    assert facts.reachable
    assert facts.identity == layers.identity(json.loads(inspected)[0])
    assert facts.staged == {"blobs/sha256/x": 7}
    assert facts.zstd == (shutil.which("zstd") is not None)
    assert facts.images == [["sha256:aa", "sha256:bb"], ["sha256:cc"]]


def test_a_worker_without_the_image_has_no_identity_and_a_cut_answer_is_unreachable(
    tmp_path: Path,
) -> None:
    facts = probe(tmp_path, "", {})
    assert facts.reachable and facts.identity == "" and facts.staged == {}
    cut = "== pinned\n[]\n== staged\n"
    assert not engine.parse_image_probe(cut).reachable
    assert not engine.parse_image_probe("").reachable


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({}, "unreachable"),
        ({"reachable": True, "identity": "content:1"}, "has"),
        ({"reachable": True, "identity": "content:2", "staged": {"a": 1}}, "staged"),
        ({"reachable": True, "staged": {"a": 0}, "images": [["sha256:aa"]], "zstd": True},
         "1 zstd"),
        ({"reachable": True, "images": [["sha256:bb"]]}, "0 plain"),
    ],
    ids=["unreachable", "has", "staged", "holds-the-base", "holds-nothing"],
)  # fmt: skip
def test_a_chain_members_fact(facts: dict[str, object], expected: str) -> None:
    found = engine.ImageFacts(**facts)
    assert engine.image_chain_fact(found, "content:1", ["sha256:aa", "sha256:cc"]) == expected


# --- the relay chain -----------------------------------------------------------------------------


@pytest.mark.parametrize("down", ["", "ssh://u@10.0.0.4:22"], ids=["whole", "last-hop-down"])
def test_a_relay_chain_stores_the_same_bytes_on_every_worker(tmp_path: Path, down: str) -> None:
    """The engine's stream to the first member's relay.sh passes worker to worker (the fake ssh
    runs each hop here): each stores it with the sink and reports its status, passed back up
    the chain. The members' scripts live in a directory with a space and a quote (one quoting
    level per hop); a hop that fails leaves the workers before it their copy."""
    bin_dir = tmp_path / "it's bin"
    shutil.copytree(SCRIPTS, bin_dir)
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "ssh").write_text(FAKE_SSH)
    (fake / "ssh").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(3 * 1024 * 1024))
    members = [engine.Member(name, dest, str(bin_dir)) for name, dest in
               (("spark2", "ssh://u@10.0.0.2:22"), ("spark3", "ssh://u@10.0.0.3:22"),
                ("spark4", "ssh://u@10.0.0.4:22"))]  # fmt: skip
    fabric = engine.Fabric()
    call = engine.relay_call(
        'cat > "$RELAY_OUT/stored.$$"', members, "known hosts", "ssh-ed25519 AAAA"
    )
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "RELAY_OUT": str(out),
           "DOWN": down}  # fmt: skip
    try:
        sink = engine.ssh_sink(fabric, members[0].destination, call, forward=True)
        outcome = engine.transfer(f"cat {payload}", sink, watch(stall=10), 3 * 1024 * 1024, env)
    finally:
        fabric.close()
    assert outcome.status == 0, outcome
    statuses = {m.name: engine.relayed_status(outcome.output, m.name) for m in members}
    assert statuses == {"spark2": "0", "spark3": "0", "spark4": "none" if down else "0"}
    stored = sorted(out.iterdir())
    assert len(stored) == (2 if down else 3)
    assert all(path.read_bytes() == payload.read_bytes() for path in stored)


def test_the_agent_signs_only_for_the_chains_hops() -> None:
    chain = [engine.Member("spark2", "ssh://root@10.0.0.2:22", "/b"),
             engine.Member("spark3", "ssh://root@10.0.0.3:2222", "/b")]  # fmt: skip
    assert engine.relay_limits(chain) == ["-h", "root@10.0.0.2", "-h", "10.0.0.2>root@10.0.0.3"]


def test_a_failure_is_one_message_naming_the_host_and_the_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert engine.main(["weights", "--host", "spark1", "--worker", "spark2"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("spark-vllm: spark1: weights-sync: missing --target"), said
    assert "Traceback" not in said
