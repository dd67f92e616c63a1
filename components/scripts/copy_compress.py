"""Whether a copy's stream goes compressed (fabric.compress): `zstd`, `none`, or `auto`, which
measures before it copies and picks the faster. Standard library only.

zstd pays only when the link, not the CPU, is the limit: a stream compressed to `ratio` of its
bytes moves at min(compress rate, link / ratio, decompress rate), a plain one at the link's
rate. `auto` measures the three before a stream of 1 GB or more, in about two seconds: the link
through the very SSH path the stream takes (its cipher included: on a 200G fabric SSH is the
limit, not the wire), and `zstd -1`'s rates and ratio on a sample of the payload (the weights'
own first bytes; for an image, the head's own libraries and programs, which are what its layers
mostly hold: system_sample says why not the image itself). The decompress rate is the head's:
the hosts of a cluster are alike. Both choices end in the same import on the worker (`docker
load`, `tar -x`), which the measurement leaves out: it bounds both alike.
"""

from __future__ import annotations

import glob
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

SETTINGS = ("auto", "zstd", "none")
SAMPLE_BYTES = 32 * 1024 * 1024
# Measuring costs about 1.5 s (the link probe's second, the sample): below this it would be a
# large share of the copy (the bench's 17 MB image took 1.6x zstd's time with auto), so a
# smaller stream goes with zstd unmeasured, as every image did before auto: on a slow link it
# halves the time, on a fast one it costs a small stream little.
SMALLEST_MEASURED = 1_000_000_000
LINK_PROBE_SECONDS = 1.0
# zstd costs CPU at both ends while it runs: it must be clearly faster to be chosen.
MARGIN = 1.1
MB = 1e6
ZSTD_STAGE = "zstd -1 -T0 -q | "  # what a compressed stream passes through on the head


@dataclass(frozen=True)
class Rates:
    """What `auto` measured, in MB/s of the payload's bytes (None: not measured)."""

    link: float | None = None  # plain bytes through the SSH path to the worker
    compress: float | None = None  # what zstd -1 -T0 takes in on the head
    decompress: float | None = None  # what zstd -d gives out
    ratio: float | None = None  # compressed size / size, on the sample

    def measured(self) -> bool:
        return None not in (self.link, self.compress, self.decompress, self.ratio)


@dataclass(frozen=True)
class Choice:
    """The stream's compression and why, with the figures it was decided on."""

    setting: str
    zstd: bool
    why: str
    rates: Rates = Rates()

    def report(self) -> dict[str, Any]:
        """The `compress` entry of the copy's report (the `spark-vllm-*-sent` line)."""
        return {
            "setting": self.setting,
            "chosen": "zstd" if self.zstd else "none",
            "why": self.why,
            "linkMBps": rounded(self.rates.link),
            "compressMBps": rounded(self.rates.compress),
            "decompressMBps": rounded(self.rates.decompress),
            "ratio": None if self.rates.ratio is None else round(self.rates.ratio, 3),
        }


def rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 1)


def zstd_rate(rates: Rates) -> float:
    """Payload MB/s of a zstd stream: its slowest stage."""
    assert rates.link and rates.compress and rates.decompress and rates.ratio
    return min(rates.compress, rates.link / rates.ratio, rates.decompress)


def choose(setting: str, size: int, can_unpack: bool, rates: Rates) -> Choice:
    """The stream's compression: `setting` as configured, for a stream of `size` bytes, when
    every receiving end `can_unpack` zstd, on the `rates` measured (auto only)."""
    if setting not in SETTINGS:
        raise ValueError(f"compress must be one of {', '.join(SETTINGS)}, not {setting!r}")
    if setting == "none":
        return Choice(setting, False, "fabric.compress: none")
    if not can_unpack:
        return Choice(setting, False, "plain: a receiving worker has no zstd", rates)
    if setting == "zstd":
        return Choice(setting, True, "fabric.compress: zstd")
    if size < SMALLEST_MEASURED:
        return Choice(setting, True, f"zstd: {size // 1_000_000} MB is too small to measure")
    if not rates.measured():
        return Choice(setting, False, "plain: the link or zstd could not be measured", rates)
    assert rates.link and rates.compress and rates.decompress and rates.ratio
    packed = zstd_rate(rates)
    figures = (
        f"the link {rates.link:.0f} MB/s over ssh; zstd -1 {rates.compress:.0f} MB/s in, "
        f"{rates.decompress:.0f} MB/s out, to {rates.ratio:.2f} of the bytes"
    )
    if packed > MARGIN * rates.link:
        return Choice(setting, True, f"zstd, {packed / rates.link:.2f}x plain ({figures})", rates)
    return Choice(setting, False, f"plain, {rates.link / packed:.2f}x zstd ({figures})", rates)


# The measurements: facts read on the head, apart from the decision above.


def sample(source: str, size: int = SAMPLE_BYTES, seconds: float = 60) -> bytes:
    """The first `size` bytes of the bash pipeline `source` (which is then stopped); b"" when
    it gives nothing in `seconds`."""
    try:
        done = subprocess.run(
            ["bash", "-c", f"{source} | head -c {int(size)}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return b""
    return done.stdout


def codec_rates(data: bytes, seconds: float = 60) -> tuple[float, float, float] | None:
    """zstd -1's compress and decompress MB/s and its ratio on `data`; None without zstd."""
    if not data:
        return None
    try:
        started = time.monotonic()
        packed = subprocess.run(["zstd", "-1", "-T0", "-q", "-c"], input=data,
                                capture_output=True, timeout=seconds, check=True)  # fmt: skip
        middle = time.monotonic()
        subprocess.run(["zstd", "-d", "-q", "-c"], input=packed.stdout,
                       capture_output=True, timeout=seconds, check=True)  # fmt: skip
        ended = time.monotonic()
    except (OSError, subprocess.SubprocessError):
        return None
    size = len(data) / MB
    return (
        size / max(middle - started, 1e-6),
        size / max(ended - middle, 1e-6),
        len(packed.stdout) / len(data),
    )


def link_rate(sink: str, data: bytes, seconds: float = LINK_PROBE_SECONDS) -> float | None:
    """MB/s of `data`, sent over and over for about `seconds` into the bash pipeline `sink`
    (the stream's own SSH path, ending in `cat > /dev/null`), counted until the far end has
    taken all of it; None when it failed or stalled."""
    if not data:
        return None
    consumer = subprocess.Popen(
        ["bash", "-c", sink],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert consumer.stdin is not None
    sent = [0]
    view = memoryview(data)
    chunk = 1024 * 1024

    def write() -> None:
        stream = consumer.stdin
        assert stream is not None
        until = time.monotonic() + seconds
        try:
            while time.monotonic() < until:
                for offset in range(0, len(view), chunk):
                    stream.write(view[offset : offset + chunk])
                    sent[0] += len(view[offset : offset + chunk])
                    if time.monotonic() >= until:
                        break
            stream.close()
        except OSError:
            sent[0] = 0

    started = time.monotonic()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(timeout=seconds + 30)
    try:
        status = consumer.wait(timeout=max(1.0, seconds + 30 - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        consumer.kill()
        consumer.wait()
        return None
    elapsed = time.monotonic() - started
    if writer.is_alive() or status != 0 or sent[0] == 0:
        return None
    return sent[0] / MB / elapsed


def system_sample(size: int = SAMPLE_BYTES, piece: int = 4 * 1024 * 1024) -> bytes:
    """Up to `size` bytes of the head's own largest shared libraries and programs, `piece` of
    each: what an image's layers mostly hold. Not the image itself: on Docker's classic store
    `docker save` writes the whole export to a temporary directory before it sends a byte (moby
    image/tarexport), so its first 32 MB cost a full save (minutes for a real image)."""
    found: list[tuple[int, str]] = []
    for directory in [*sorted(glob.glob("/usr/lib/*-linux-gnu")), "/usr/lib", "/usr/bin"]:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):
                    found.append((entry.stat(follow_symlinks=False).st_size, entry.path))
            except OSError:
                continue
    chunks: list[bytes] = []
    taken = 0
    for _, path in sorted(found, reverse=True):
        if taken >= size:
            break
        try:
            with open(path, "rb") as file:
                chunk = file.read(min(piece, size - taken))
        except OSError:
            continue
        chunks.append(chunk)
        taken += len(chunk)
    return b"".join(chunks)


def measure(data: bytes, probe_sink: str) -> Rates:
    """What `auto` decides on, for a stream whose content `data` samples (the link is measured
    with random bytes: ssh does not compress). The caller measures only a stream of
    SMALLEST_MEASURED or more: choose sends a smaller one with zstd, unmeasured."""
    codec = codec_rates(data)
    if codec is None:
        return Rates()
    compress, decompress, ratio = codec
    return Rates(link_rate(probe_sink, os.urandom(SAMPLE_BYTES)), compress, decompress, ratio)
