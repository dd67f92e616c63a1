"""The copies' watchdog (lib.sh report_progress, stop_stalled), run for real with bash: a stream
in flight that moves nothing for the stall time is stopped, its whole process group, and the
stall recorded; a quiet while after every stream ended (the worker loading what it got) is not
a stall."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "components" / "scripts"

# A transfer as image-sync.sh and weights-sync.sh run one: `timeout` around a `bash -c` that
# records its PID, then a pipe metered by dd. Its source sends 3 MB over 2 s, then hangs (a
# worker that stopped reading holds the pipe just so).
TRANSFER = (
    'timeout 120 bash -c \'echo $$ >"$1.pid"; set -o pipefail; '
    "{ head -c 1500000 /dev/zero; sleep 1.2; head -c 1500000 /dev/zero; sleep 300; } "
    '| dd bs=64k status=progress 2>"$1/save" | cat >/dev/null\' transfer "$1"'
)

# A transfer whose stream ends (dd prints its end record), then waits 6 s for the worker's load.
ENDED = (
    'timeout 120 bash -c \'echo $$ >"$1.pid"; head -c 2000000 /dev/zero '
    '| dd bs=64k status=progress 2>"$1/save" >/dev/null; sleep 6\' transfer "$1"'
)


def watch(meters: Path, stall: int, script: str, seconds: float) -> subprocess.CompletedProcess:
    """`script` (with the meters dir as $1) in the background, report_progress beside it every
    second with `stall`, for at most `seconds`; prints the transfer's exit status."""
    text = (
        f'. "{SCRIPTS}/lib.sh"\n'
        f'report_progress spark2 image 10000000 "$1" 1 {stall} & reporter=$!\n'
        # lib.sh sets errexit; the copy scripts run their transfers under `set +e` just so.
        f"status=0; {script} || status=$?\n"
        'kill "$reporter" 2>/dev/null || true\n'
        'echo "status $status"\n'
    )
    return subprocess.run(
        ["timeout", str(seconds), "bash", "-c", text, "watch", str(meters)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_stream_that_stops_moving_is_stopped_with_its_process_group(tmp_path: Path) -> None:
    meters = tmp_path / "meters"
    meters.mkdir()
    started = time.monotonic()
    done = watch(meters, 3, TRANSFER, 60)
    elapsed = time.monotonic() - started
    # Stopped by the watchdog (TERM to the group: `timeout` exits 143), not by the test's timeout.
    assert done.returncode == 0, done.stderr
    assert "status 143" in done.stdout, done.stdout
    assert elapsed < 20, (elapsed, done.stderr)
    stalled = int((tmp_path / "meters.stalled").read_text())
    assert 1_000_000 <= stalled <= 3_000_000, stalled
    # The progress lines came first; then nothing is left of the transfer (its sleep included).
    assert "spark2: image " in done.stderr
    pid = (tmp_path / "meters.pid").read_text().strip()
    left = subprocess.run(["pgrep", "-g", pid], capture_output=True, text=True, check=False)
    assert left.stdout == "", left.stdout


def test_a_quiet_while_after_the_stream_ended_is_not_a_stall(tmp_path: Path) -> None:
    """dd has printed its end record (every byte went out): the worker is loading what it got,
    which can take minutes, and the watchdog leaves it be."""
    meters = tmp_path / "meters"
    meters.mkdir()
    done = watch(meters, 2, ENDED, 60)
    assert "status 0" in done.stdout, (done.stdout, done.stderr)
    assert not (tmp_path / "meters.stalled").exists()


def test_an_earlier_stream_that_never_ended_its_log_does_not_make_a_later_one_stall(
    tmp_path: Path,
) -> None:
    """A relay stopped midway leaves a log without its end record; the copy after it ends its
    stream and waits for the worker's load: that quiet while is no stall either."""
    meters = tmp_path / "meters"
    meters.mkdir()
    (meters / "relay").write_text("1048576 bytes (1.0 MB, 1.0 MiB) copied, 1 s, 1.0 MB/s\r")
    time.sleep(1.1)  # the relay's log is the older one, as it was written first
    done = watch(meters, 2, ENDED, 60)
    assert "status 0" in done.stdout, (done.stdout, done.stderr)
    assert not (tmp_path / "meters.stalled").exists()
