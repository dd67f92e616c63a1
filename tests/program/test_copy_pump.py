"""copy_pump.py, the copy's byte pump: its transfers run for real (bash pipelines, a stream
that stops moving, one that ends, a deadline)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.program.scripting import load, watch

pump = load("copy_pump")


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
    outcome = pump.transfer(source, sink, watch(stall=3), 10_000_000)
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
    outcome = pump.transfer("head -c 2000000 /dev/zero", "cat >/dev/null; sleep 4; echo stored",
                              watch(stall=1), 2_000_000)  # fmt: skip
    assert (outcome.status, outcome.stalled, outcome.sent) == (0, False, 2_000_000)
    assert outcome.output == "stored\n"


def test_a_stream_still_running_at_the_deadline_is_stopped_as_a_timeout() -> None:
    started = time.monotonic()
    outcome = pump.transfer("sleep 303.5", "cat >/dev/null", watch(seconds=2), 1)
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
    outcome = pump.transfer(source, sink, watch(stall=5), 1)
    assert (outcome.status, outcome.stalled) == (status, False)
