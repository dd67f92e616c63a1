"""The distribution benchmark, short (small sizes, one repetition): `python -m lab bench --short`
on a 4-host lab of the session, so that it cannot rot. Its timings are reported, not asserted
(a benchmark prints ratios; tests do not time things); what the copy code guarantees whatever
the machine, the bytes it moves, is asserted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import Lab
from lab.bench import BENCH_ENGINES, IMAGE, run_bench
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
        # What `python -m lab bench --real-image` runs on the real 4 GB image, on the small one
        # (so that it cannot rot): each method must land the head's layers.
        engine, raw = bench.image_side_by_side(bench.workers[0], IMAGE)
        record_figure("bench --short: one image, engine vs docker save | ssh | docker load",
                      f"{engine:.1f} s vs {raw:.1f} s (the bench's small image)")  # fmt: skip
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
