"""The byte pump of a copy (copy_engine.py): one stream from a bash pipeline on the head into
another, counted here, its progress, rate and ETA printed, and stopped, both ends, when it stalls
or runs past the copy's deadline. Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import IO

from hostlib import note

CHUNK = 1024 * 1024
MB = 1000000
# A stopped transfer's processes get this long to end on SIGTERM before SIGKILL.
KILL_GRACE_SECONDS = 5


@dataclass
class Watch:
    """How a copy watches its streams: who and what (for progress lines), a progress line every
    `progress_seconds`, a stream stopped after `stall_seconds` (0: never) without a byte moving,
    and the copy's deadline (time.monotonic)."""

    label: str
    what: str
    progress_seconds: float
    stall_seconds: float
    deadline: float


@dataclass
class Outcome:
    """How a stream ended: its exit status (124: the deadline passed), the bytes it moved,
    whether the watchdog stopped it, and what the receiving end printed."""

    status: int
    sent: int
    stalled: bool
    output: str


@dataclass
class Meter:
    sent: int = 0
    moved_at: float = field(default_factory=time.monotonic)

    def add(self, count: int) -> None:
        self.sent += count
        self.moved_at = time.monotonic()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(source: IO[bytes], sink: IO[bytes], meter: Meter) -> None:
    """Every byte of `source` into `sink`, counted once written; ends at EOF or a broken pipe."""
    try:
        while chunk := os.read(source.fileno(), CHUNK):
            _write_all(sink.fileno(), chunk)
            meter.add(len(chunk))
    except OSError:
        pass
    finally:
        for end in (sink, source):
            with suppress(OSError):
                end.close()


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Each process's whole group (each runs in a session of its own): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
        ends = time.monotonic() + KILL_GRACE_SECONDS
        while time.monotonic() < ends and any(p.poll() is None for p in processes):
            time.sleep(0.1)


def _status(process: subprocess.Popen[bytes]) -> int:
    code = process.wait()
    return 128 - code if code < 0 else code


def transfer(
    source: str, sink: str, watch: Watch, total: int, env: dict[str, str] | None = None
) -> Outcome:
    """`source`'s stdout (a bash pipeline) into `sink`'s stdin (another), counted here. Every
    `progress_seconds` a line `LABEL: WHAT SENT of TOTAL MB, RATE MB/s, ETA S s`; a stream still
    in flight that moved nothing for `stall_seconds` is stopped, both ends' process groups, as is
    one still running at the deadline. Once every byte is out, a quiet while is the receiving
    end storing what it got (a `docker load` takes minutes), not a stall."""
    meter = Meter()
    with tempfile.TemporaryFile() as output:
        producer = subprocess.Popen(
            ["bash", "-c", "set -o pipefail; " + source],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        consumer = subprocess.Popen(
            ["bash", "-c", "set -o pipefail; " + sink],
            stdin=subprocess.PIPE,
            stdout=output,
            start_new_session=True,
            env=env,
        )
        assert producer.stdout is not None and consumer.stdin is not None
        pump = threading.Thread(target=_pump, args=(producer.stdout, consumer.stdin, meter))
        pump.start()
        started = reported = time.monotonic()
        stalled = timed_out = False
        while pump.is_alive() or producer.poll() is None or consumer.poll() is None:
            pump.join(timeout=0.2)
            now = time.monotonic()
            if (
                watch.stall_seconds
                and pump.is_alive()
                and now - meter.moved_at >= watch.stall_seconds
            ):
                stalled = True
            timed_out = now >= watch.deadline
            if stalled or timed_out:
                _stop([producer, consumer])
                break
            if now - reported >= watch.progress_seconds:
                reported = now
                rate = meter.sent // max(1, int(now - started))
                eta = (total - meter.sent) // rate if rate else 0
                note(
                    f"{watch.label}: {watch.what} {meter.sent // MB} of {total // MB} MB, "
                    f"{rate // MB} MB/s, ETA {max(0, eta)} s"
                )
        pump.join()
        produced, consumed = _status(producer), _status(consumer)
        output.seek(0)
        said = output.read().decode(errors="replace")
    status = 124 if timed_out and not stalled else (consumed or produced)
    return Outcome(status=status, sent=meter.sent, stalled=stalled, output=said)
