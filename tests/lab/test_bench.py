"""The distribution benchmark, short (small sizes, one repetition): `python -m lab bench --short`
on a 4-host lab of the session, so that it cannot rot. Its timings are reported, not asserted
(a benchmark prints ratios; tests do not time things, and this machine is shared); what the copy
code guarantees whatever the machine, the bytes it moves, is asserted, and that the image side
by side (what `python -m lab bench --real-image` runs on the real image) measured every method
and floor, and that --compress auto said what it chose."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab import Lab
from lab.bench import (
    BENCH_ENGINES,
    ENGINE,
    IMPORT_FLOOR,
    LINK_FLOOR,
    SIDE,
    SIDE_METHODS,
    compress_decision,
    describe_compress,
    run_bench,
    sent_report,
)
from tests.lab.timings import record_figure

pytestmark = pytest.mark.lab

BYTE_GOALS = (
    "image update of one layer: bytes <= 1.2x the layer",
    "revision of one file: bytes <= 1.1x the file (and the image unchanged)",
    "resume after a cut at ~50%: bytes <= 1.1x what was missing",
    "image resume after a cut at ~50%: bytes <= 1.1x what was missing",
    "nothing changed: 0 bytes",
    "containerd store, image update of one layer: bytes <= 1.2x the layer",
    "containerd store, image resume after a cut at ~50%: bytes <= 1.1x the missing",
    "containerd store, nothing changed: 0 bytes",
)


def test_the_short_benchmark_runs_and_reports_every_case(
    lab_factory: Callable[..., Lab], tmp_path: Path
) -> None:
    lab = lab_factory(
        "bench",
        hosts=4,
        topology="bastion",
        with_image=False,
        with_model=False,
        engines=BENCH_ENGINES,
    )
    try:
        text, bench = run_bench(
            lab, short=True, out=tmp_path, command="python -m lab bench --short"
        )
    finally:
        lab.down()  # free the machine for later modules
    results = json.loads((tmp_path / "bench.json").read_text())
    cases = {(r["case"], r["regime"], r["workers"], r["method"]) for r in results["rows"]}
    for regime in ("rate-limited", "unlimited"):
        for workers in (1, 3):
            for method in ("raw ssh stream", "seeds' method", "spark-vllm"):
                assert ("image+weights", regime, workers, method) in cases
    assert ("image+weights", "rate-limited", 1, "floor (bytes / rate)") in cases
    assert (tmp_path / "bench.png").stat().st_size > 10_000
    assert "| goal | result | measured |" in text
    goals = {g["goal"]: g for g in results["goals"]}
    for goal in goals.values():
        record_figure(f"bench --short: {goal['goal']}",
                      f"{'PASS' if goal['pass'] else 'MISS'} ({goal['measured']})")  # fmt: skip
    for goal in BYTE_GOALS:
        assert goals[goal]["pass"], (goal, goals[goal], text)
    # The seeds' method moves the whole payload from the head to every worker; spark-vllm's
    # first copy moves it from the head once, relayed from worker to worker (plus each worker's
    # own snapshot links, a few KB).
    first = {
        r["method"]: r
        for r in results["rows"]
        if (r["case"], r["regime"], r["workers"]) == ("image+weights", "unlimited", 3)
    }
    assert first["seeds' method"]["bytes"] == 3 * bench.payload
    assert 0.99 * bench.payload <= first["spark-vllm"]["bytes"] <= bench.payload + 3 * 64 * 1024
    assert_the_image_side_by_side(results["rows"], text)


def assert_the_image_side_by_side(rows: list[dict[str, Any]], text: str) -> None:
    """Every method and floor of the image side by side measured in both regimes (a copy that
    did not land the head's layers fails the run itself), the engine's copies sent the image
    at most once, and --compress auto chose none or zstd; the times are printed, never held to
    the goals."""
    assert "| regime | method | seconds | x the larger floor | MB moved | compression |" in text
    for regime in ("rate-limited", "unlimited"):
        side = {r["method"]: r for r in rows if (r["case"], r["regime"]) == (SIDE, regime)}
        assert set(side) == set(SIDE_METHODS), (regime, sorted(side))
        saved = side[LINK_FLOOR]["bytes"]
        assert saved > 0
        for method in SIDE_METHODS:
            assert side[method]["seconds"] > 0, (regime, method, side[method])
        for setting, method in ENGINE.items():
            # At most once (the engine saves by image ID, no name in its manifest: its tar
            # differs from `docker save NAME`'s by a few bytes and the tar's block padding);
            # uncompressed, the whole of it.
            sent = side[method]["bytes"]
            assert 0 < sent <= saved + 64 * 1024, (regime, method, sent, saved)
            decisions = side[method]["compress"]
            assert decisions and all(d["chosen"] in ("none", "zstd") for d in decisions), (
                regime,
                method,
                decisions,
            )
            if setting == "none":
                assert saved - 64 * 1024 <= sent, (regime, sent, saved)
                assert all(d["chosen"] == "none" for d in decisions), (regime, decisions)
        floor = max(side[IMPORT_FLOOR]["seconds"], side[LINK_FLOOR]["seconds"])
        times = ", ".join(f"{m} {side[m]['seconds'] / floor:.2f}x" for m in SIDE_METHODS)
        record_figure(
            f"bench --short: the image side by side, {regime} (x the larger floor)",
            f"{times}; auto chose {describe_compress(side[ENGINE['auto']]['compress'])}",
        )


def test_the_engine_report_is_read_with_or_without_its_compress_decision() -> None:
    """The engine's last line carries `compress` where it measured, and may not (a tiny payload):
    the choice is then the setting; a line of the weights copy reads the same way."""
    measured = sent_report(
        "copied it\n"
        'spark-vllm-image-sent {"bytes": 10, "compress": {"setting": "auto", "chosen": "zstd", '
        '"why": "the link is the limit", "linkMBps": 11.5, "compressMBps": 250.0, '
        '"decompressMBps": null, "ratio": 2.0}}\n'
    )
    decision = compress_decision(measured, "auto")
    assert (measured["bytes"], decision["chosen"]) == (10, "zstd")
    assert describe_compress([decision]) == (
        "zstd: the link is the limit (link 12 MB/s, zstd -1 250 MB/s, ratio 2.00)"
    )
    bare = sent_report('spark-vllm-weights-sent {"bytes":7,"total":7}')
    assert compress_decision(bare, "none")["chosen"] == "none"
    assert compress_decision(bare, "auto")["chosen"] == "auto"
