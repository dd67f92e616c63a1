"""memory_guard.py: the memory guard's decisions, facts in and decision out: the thresholds for
a host, when it acts, which container it stops, and the line the readiness wait quotes. The
guard against real Docker and a real runaway start: tests/lab/test_memory_faults.py."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest

from stacks.plan.hardware import AUTO_MARGIN_FRACTION, AUTO_MIN_MARGIN_BYTES
from tests.program.scripting import FAKE_SSH, SCRIPTS, fake_bin, load

guard = load("memory_guard")

GIB = 1 << 30
SPARK_TOTAL = int(119.7 * GIB)  # a DGX Spark's MemTotal

MEMINFO = """MemTotal:       24522392 kB
MemFree:         1034876 kB
MemAvailable:   20338500 kB
Buffers:          123456 kB
"""
PSI = """some avg10=12.50 avg60=3.10 avg300=0.80 total=123456
full avg10=4.25 avg60=1.00 avg300=0.20 total=65432
"""


def test_the_host_figures_are_read_as_the_kernel_writes_them() -> None:
    memory = guard.parse_meminfo(MEMINFO)
    assert (memory.total, memory.available) == (24522392 * 1024, 20338500 * 1024)
    assert guard.parse_pressure(PSI) == 4.25  # `full`, not `some`
    assert guard.parse_pressure("") is None  # a kernel without PSI


@pytest.mark.parametrize(
    ("setting", "total", "floor"),
    [
        ("auto", SPARK_TOTAL, int(SPARK_TOTAL * 0.03)),  # 3.6 GiB on a Spark
        ("auto", 24 * GIB, GIB),  # a small host: at least 1 GiB
        (str(5 * GIB), SPARK_TOTAL, 5 * GIB),  # as configured
    ],
)
def test_the_floor_is_three_percent_and_at_least_a_gib(
    setting: str, total: int, floor: int
) -> None:
    assert guard.limits_of(setting, 60, total).min_available == floor


def test_auto_sits_below_what_the_memory_check_keeps_beside_a_server_it_sized() -> None:
    """A server that took what the memory check gave it leaves the check's margin available:
    the guard must not act on it, on a Spark or on a small host."""
    for total in (SPARK_TOTAL, 24 * GIB, 64 * GIB):
        margin = max(AUTO_MARGIN_FRACTION * total, AUTO_MIN_MARGIN_BYTES)
        assert guard.limits_of("auto", 60, total).min_available < margin


@pytest.mark.parametrize(
    ("available_gib", "pressure", "acts_on"),
    [
        (10.0, 1.0, None),
        (0.9, None, "0.9 GiB of 23.4 GiB available, below the guard's 1.0 GiB"),
        (1.0, None, None),  # at the floor: not below it
        (10.0, 60.0, "memory pressure 60% (PSI full avg10), at or above the guard's 60%"),
        (10.0, 59.9, None),
    ],
)
def test_it_acts_below_the_floor_or_at_the_pressure_limit(
    available_gib: float, pressure: float | None, acts_on: str | None
) -> None:
    memory = guard.Memory(int(23.4 * GIB), int(available_gib * GIB))
    assert guard.breach(memory, pressure, guard.Limits(GIB, 60)) == acts_on


def test_a_pressure_limit_of_zero_leaves_pressure_alone() -> None:
    memory = guard.Memory(24 * GIB, 10 * GIB)
    assert guard.breach(memory, 100.0, guard.Limits(GIB, 0)) is None


NOW = 10_000.0
WINDOW = 1800.0  # timeouts.vllmReadySeconds


def server(name: str, role: str, started: float, ready: bool = False) -> object:
    return guard.Server(f"{name}-id-0123456789", name, role, NOW - started, ready)


def acted_on(*servers: object) -> frozenset[tuple[str, float]]:
    return frozenset(s.start for s in servers)  # type: ignore[attr-defined]


M0_STARTING = server("m0", "vllm", 60)


@pytest.mark.parametrize(
    ("servers", "acted", "stopped", "said"),
    [
        # A server in its first minute, not ready: the one starting, stopped.
        ([M0_STARTING], frozenset(), "m0", ""),
        # Beside a ready server, the one starting, not the newest by accident.
        ([server("m0", "vllm", 900, ready=True), server("m1", "vllm", 60)], frozenset(), "m1", ""),
        # The newest of two starting (a reboot starts both): the last Docker started.
        ([server("m0", "vllm", 90), server("m1", "vllm-headless", 30)], frozenset(), "m1", ""),
        # A tie (a reboot starts several in one second): by name, so every run agrees.
        ([server("a", "vllm", 100), server("b", "vllm", 100)], frozenset(), "b", ""),
        # A hog beside a ready server: nothing stopped, said once why.
        ([server("m0", "vllm", 60, ready=True)], frozenset(), None,
         "no server of ours is starting here (1 ready, 0 past their start window or already "
         "stopped once in this start): nothing stopped; the memory is another process's"),
        # Past its start window (the readiness wait gave up on it): not the one starting.
        ([server("m0", "vllm-headless", WINDOW + 1)], frozenset(), None,
         "no server of ours is starting here (0 ready, 1 past their start window or already "
         "stopped once in this start): nothing stopped; the memory is another process's"),
        # At most once per start: the same start (ID and StartedAt) is not stopped again...
        ([M0_STARTING], acted_on(M0_STARTING), None,
         "no server of ours is starting here (0 ready, 1 past their start window or already "
         "stopped once in this start): nothing stopped; the memory is another process's"),
        # ...but its next start (same ID, a later StartedAt) is.
        ([server("m0", "vllm", 10)], acted_on(M0_STARTING), "m0", ""),
        # Ray containers never, however new (they hold every model's workers on the node).
        ([server("ray", "ray-worker", 5)], frozenset(), None,
         "no server of ours runs here: nothing stopped"),
        ([server("ray", "ray-head", 5), server("m0", "vllm", 60, ready=True)], frozenset(),
         None, "no server of ours is starting here (1 ready, 0 past their start window or "
         "already stopped once in this start): nothing stopped; the memory is another "
         "process's"),
        # The front and the guards are never candidates.
        ([server("front", "front", 5), server("guard", "memory-guard", 5)], frozenset(), None,
         "no server of ours runs here: nothing stopped"),
        ([], frozenset(), None, "no server of ours runs here: nothing stopped"),
    ],
)  # fmt: skip
def test_it_stops_only_a_server_that_is_starting_and_once_per_start(
    servers: list[object], acted: frozenset[tuple[str, float]], stopped: str | None, said: str
) -> None:
    decision = guard.decide(servers, acted, NOW, WINDOW)
    assert (decision.server.name if decision.server else None, decision.why_not) == (stopped, said)


@pytest.mark.parametrize(
    ("header", "ready_since"),
    [
        (None, None),  # 404: no marker in this container
        # Docker's stat of the path: its mtime in the daemon's zone, to the nanosecond.
        ('{"name":"spark-vllm-ready","size":0,"mode":420,"mtime":"1970-01-01T01:16:40.5+01:00"}',
         1000.5),
        ('{"name":"spark-vllm-ready","size":0,"mode":420,"mtime":"1970-01-01T00:16:40.25Z"}',
         1000.25),
    ],
)  # fmt: skip
def test_the_ready_marker_is_read_from_dockers_stat_of_it(
    header: str | None, ready_since: float | None
) -> None:
    encoded = base64.b64encode(header.encode()).decode() if header else None
    assert guard.marker_mtime(encoded) == ready_since


def test_its_line_names_the_node_the_container_and_the_figures() -> None:
    stopped = guard.Server(
        "4f2a9c1b7d3e" + "0" * 52, "spark-vllm-vllm", "vllm-headless", 1000.0, ready=False
    )
    line = guard.stop_line("spark2", stopped, "0.9 GiB of 23.4 GiB available", 12.0, 1042.0)
    assert line == (
        "spark-vllm: spark2: memory-guard: stopped spark-vllm-vllm (id 4f2a9c1b7d3e, "
        "vllm-headless, started 42s before) at 1970-01-01T00:17:22Z: 0.9 GiB of 23.4 GiB "
        "available; memory pressure 12%"
    )
    # What the readiness wait greps for (diagnose.sh guard_stopped): the stop and the ID.
    assert guard.STOP_LINE in line and "(id 4f2a9c1b7d3e," in line


def test_dockers_start_time_is_read_to_the_microsecond() -> None:
    assert guard.started_at("1970-01-01T00:16:40.123456789Z") == pytest.approx(1000.123456)
    assert guard.started_at("1970-01-01T00:16:40Z") == 1000.0


# A Docker CLI stand-in for diagnose.sh's guard_stopped: `inspect` answers the current
# container's ID; the guard's log holds a stop of an earlier container and one of this one.
FAKE_DOCKER = """#!/usr/bin/env bash
case "$1" in
  inspect) echo "4f2a9c1b7d3e000000000000000000000000000000000000000000000000cafe" ;;
  logs) cat <<'LOG'
spark-vllm: spark2: memory-guard: watching: acts below 1.0 GiB available of 23.4 GiB
spark-vllm: spark2: memory-guard: stopped spark-vllm-vllm (id 0123456789ab, vllm-headless, started 9s before) at 2026-12-05T01:00:00Z: 0.8 GiB of 23.4 GiB available, below the guard's 1.0 GiB
  likely cause: an earlier start
spark-vllm: spark2: memory-guard: stopped spark-vllm-vllm (id 4f2a9c1b7d3e, vllm-headless, started 41s before) at 2026-12-05T02:00:00Z: 0.9 GiB of 23.4 GiB available, below the guard's 1.0 GiB
  likely cause: this start
LOG
  ;;
esac
"""  # noqa: E501


@pytest.mark.parametrize("dest", ["-", "spark2-fabric"])
def test_the_wait_quotes_the_guards_stop_of_its_own_container_only(
    tmp_path: Path, dest: str
) -> None:
    """diagnose.sh guard_stopped, on the head (`-`) or over the fabric: the stop naming the
    container's current ID, with its cause; an earlier container's stop is not this one's."""
    env = fake_bin(tmp_path, docker=FAKE_DOCKER, ssh=FAKE_SSH)
    script = (
        f'. "{SCRIPTS}/lib.sh"; . "{SCRIPTS}/diagnose.sh"; '
        "ARG_GUARD_CONTAINER=spark-vllm-memory-guard; "
        f'guard_stopped "spark2|{dest}|spark-vllm-vllm"'
    )
    done = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "(id 4f2a9c1b7d3e," in lines[0], done
    assert lines[1] == "  likely cause: this start"


def test_without_a_guard_the_wait_asks_nothing(tmp_path: Path) -> None:
    env = fake_bin(tmp_path, docker="#!/bin/sh\necho called >&2; exit 1\n")
    script = f'. "{SCRIPTS}/lib.sh"; . "{SCRIPTS}/diagnose.sh"; guard_stopped "spark2|-|c"'
    done = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )
    assert (done.stdout, done.stderr) == ("", "")
