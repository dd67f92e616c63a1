"""What every copy step shares (copy_image.py, copy_weights.py): the flags, the fabric, one
deadline for the whole copy, the watch its streams run under, and what it reports it sent.
Standard library only.
"""

from __future__ import annotations

import shutil
import time

import copy_compress
from copy_compress import Choice, Rates
from copy_pump import Watch
from copy_transport import Fabric, ssh_sink
from hostlib import note, require


class Copy:
    """What both copies share: the flags every copy step has, the fabric, one deadline for the
    whole copy (relay included), the bytes sent and the workers a relay served."""

    step = ""
    what = ""
    needs: tuple[str, ...] = ()

    def __init__(self, flags: dict[str, str]) -> None:
        require(flags, "host", "worker", "target", "worker-bin", "timeout-minutes", *self.needs)
        self.flags = flags
        self.worker, self.target = flags["worker"], flags["target"]
        self.minutes = int(flags["timeout_minutes"])
        self.started = time.monotonic()
        self.deadline = self.started + 60 * self.minutes
        self.fabric = Fabric(flags.get("fabric_key", ""), flags.get("fabric_known_hosts", ""))
        self.sent = 0
        self.relayed = 0
        self.choice: Choice | None = None  # the compression of the last stream sent

    def sample(self, source: str) -> bytes:
        """What the stream from the bash pipeline `source` holds, for auto's measuring."""
        return copy_compress.sample(source)

    def compression(self, source: str, destination: str, size: int, can_unpack: bool) -> Choice:
        """The compression of a stream of `size` bytes from the bash pipeline `source` to
        `destination` (fabric.compress; `auto` measures first: copy_compress.py), said on its
        own line. `can_unpack`: every receiving end has zstd."""
        setting = self.flags.get("compress", "none")
        can = can_unpack and shutil.which("zstd") is not None
        rates = Rates()
        if setting == "auto" and can and size >= copy_compress.SMALLEST_MEASURED:
            probe = ssh_sink(self.fabric, destination, "cat > /dev/null")
            rates = copy_compress.measure(self.sample(source), probe)
        self.choice = copy_compress.choose(setting, size, can, rates)
        note(f"{self.worker}: compression: {self.choice.why}")
        return self.choice

    def compression_report(self) -> dict[str, object] | None:
        """The report's `compress` entry: None when nothing was sent."""
        return self.choice.report() if self.choice is not None else None

    def watch(self, label: str) -> Watch:
        return Watch(
            label=label,
            what=self.what,
            progress_seconds=float(self.flags.get("progress_seconds", "10")),
            stall_seconds=float(self.flags.get("stall_seconds", "0")),
            deadline=self.deadline,
        )

    def seconds(self) -> float:
        """How long the step took so far: its report's `seconds` (the cold-start figures)."""
        return round(time.monotonic() - self.started, 1)

    def run(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.fabric.close()
