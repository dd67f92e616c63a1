"""copy_compress.py: fabric.compress's decision, figures in and choice out (table-tested, as
pyinfra tests its operations), and the measurements it decides on, run here for real (zstd, a
pipe standing for the SSH path)."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.program.scripting import load

compress = load("copy_compress")
Rates = compress.Rates
BIG = 4_000_000_000  # a real-size image's stream

# Spark-like: AES-GCM ssh about 1.2 GB/s, zstd -1 -T0 on 20 cores, images about halved.
SPARK = Rates(link=1200.0, compress=3000.0, decompress=1500.0, ratio=0.5)
# This lab: every end on the same two cores, the veth link as fast as the cipher.
LAB = Rates(link=700.0, compress=450.0, decompress=900.0, ratio=0.5)
# A slow link (1 Gbit/s): zstd pays for itself twice over on compressible bytes.
SLOW = Rates(link=118.0, compress=450.0, decompress=900.0, ratio=0.5)
# The link could not be measured (the probe failed): plain, as before auto.
UNMEASURED = Rates(link=None, compress=450.0, decompress=900.0, ratio=0.5)
# Weights barely shrink: even a slow link gains little, and the margin keeps them plain.
WEIGHTS_SLOW = Rates(link=118.0, compress=450.0, decompress=900.0, ratio=0.93)


@pytest.mark.parametrize(
    ("setting", "size", "can_unpack", "rates", "zstd", "why"),
    [
        ("none", BIG, True, SLOW, False, "fabric.compress: none"),
        ("zstd", BIG, True, LAB, True, "fabric.compress: zstd"),
        ("zstd", BIG, False, LAB, False, "no zstd"),
        ("auto", BIG, False, SLOW, False, "no zstd"),
        # Small: not worth the measuring (about 1.5 s): zstd, as before auto.
        ("auto", 300_000_000, True, Rates(), True, "300 MB is too small to measure"),
        ("auto", 300_000_000, False, Rates(), False, "no zstd"),
        ("auto", BIG, True, UNMEASURED, False, "could not be measured"),
        # The CPU is the limit: zstd would be slower than the plain stream.
        ("auto", BIG, True, LAB, False, "plain, 1.56x zstd"),
        # The link is the limit: 2x the bytes per second on the wire, zstd's stages faster still.
        ("auto", BIG, True, SLOW, True, "zstd, 2.00x plain"),
        # zstd -d's rate caps it: 1500 against a 1200 link is 1.25x, above the 1.1 margin.
        ("auto", BIG, True, SPARK, True, "zstd, 1.25x plain"),
        # 118 / 0.93 = 127 MB/s: 1.08x, inside the margin: plain.
        ("auto", BIG, True, WEIGHTS_SLOW, False, "plain, 0.93x zstd"),
    ],
)
def test_the_choice(
    setting: str, size: int, can_unpack: bool, rates: object, zstd: bool, why: str
) -> None:
    choice = compress.choose(setting, size, can_unpack, rates)
    assert choice.zstd is zstd
    assert why in choice.why, choice.why


def test_the_report_carries_the_figures_it_was_decided_on() -> None:
    report = compress.choose("auto", BIG, True, SLOW).report()
    assert report == {
        "setting": "auto",
        "chosen": "zstd",
        "why": report["why"],
        "linkMBps": 118.0,
        "compressMBps": 450.0,
        "decompressMBps": 900.0,
        "ratio": 0.5,
    }
    assert "the link 118 MB/s over ssh" in report["why"]


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, zstd, none"):
        compress.choose("lz4", BIG, True, SLOW)


needs_zstd = pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd is not installed")


@needs_zstd
def test_the_codec_is_measured_on_the_sample() -> None:
    zeros = compress.codec_rates(bytes(8_000_000))
    noise = compress.codec_rates(os.urandom(8_000_000))
    assert zeros and noise
    assert zeros[0] > 0 and zeros[1] > 0
    assert zeros[2] < 0.01 < 0.99 < noise[2]  # zeros vanish, noise does not shrink


def test_a_sample_is_the_stream_s_beginning_and_stops_it() -> None:
    # `yes` never ends by itself: the sample stops it.
    assert compress.sample("yes spark", size=1000, seconds=10) == b"spark\n" * 166 + b"spar"
    assert compress.sample("sleep 5", size=10, seconds=0.5) == b""


def test_the_link_is_measured_through_the_sink_until_the_far_end_took_it_all() -> None:
    # A sink that takes about 20 MB/s: a pause after every MiB it reads.
    slow = "python3 -c 'import sys, time\nwhile sys.stdin.buffer.read(1048576): time.sleep(0.05)'"
    rate = compress.link_rate(slow, bytes(1_048_576) * 4, seconds=0.5)
    assert rate is not None and 5 < rate < 25, rate
    fast = compress.link_rate("cat >/dev/null", bytes(1_048_576) * 4, seconds=0.3)
    assert fast is not None and fast > 3 * rate
    assert compress.link_rate("exit 3", bytes(1000), seconds=0.2) is None


def test_an_image_is_sampled_from_the_heads_own_libraries_at_once() -> None:
    """Not from `docker save` (a whole export first on the classic store): 32 MB of this
    machine's largest libraries and programs, read in well under a second."""
    started = time.monotonic()
    data = compress.system_sample()
    assert time.monotonic() - started < 5
    assert len(data) == compress.SAMPLE_BYTES
    assert compress.system_sample(size=1000, piece=300)[:4] == data[:4]
