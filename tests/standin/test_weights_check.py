"""The stand-in's check of every rank's weights (model_files.py, engine.py validate_ranks), run
in this process: it picks the files vLLM loads (tests/weight_files.py, held to real vLLM in
test_conformance.py) and refuses a rank whose loaded weights differ from the driver's, never one
that differs only in files vLLM does not load (a worker given the model's include/exclude)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.weight_files import SHAPES, Shape, loaded_bytes, write_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab/image/vllm_standin/src"))
from vllm_standin import engine, model_files, multinode
from vllm_standin.worker import RankReport

AUTO_SHAPES = [s for s in SHAPES if s.load_format == "auto"]  # the stand-in serves `auto`


@pytest.mark.parametrize("shape", AUTO_SHAPES, ids=[s.name for s in AUTO_SHAPES])
def test_the_standin_picks_the_files_vllm_loads(shape: Shape, tmp_path: Path) -> None:
    snapshot = write_snapshot(tmp_path, shape)
    assert tuple(model_files.loaded_weight_names(str(snapshot))) == shape.loaded
    report = model_files.measure_snapshot(str(snapshot), None)
    assert (report.file_count, report.total_bytes) == (len(shape.loaded), loaded_bytes(shape))
    assert report.usable is bool(shape.loaded)


def rank(rank_id: int, snapshot: model_files.SnapshotReport) -> RankReport:
    return RankReport(rank_id, "10.0.0.2", "10.0.0.2", "n", "spark2", 1, snapshot, {}, None)


SHARDS = next(s for s in SHAPES if s.name.startswith("shards, and what repos carry"))


def test_a_worker_without_the_files_vllm_does_not_load_serves(tmp_path: Path) -> None:
    head = write_snapshot(tmp_path / "head", SHARDS)
    worker = write_snapshot(tmp_path / "worker", SHARDS)
    shutil.rmtree(worker / "original")
    os.unlink(worker / "model.gguf")
    driver = model_files.measure_snapshot(str(head), None)
    engine.validate_ranks([rank(1, model_files.measure_snapshot(str(worker), None))], driver)


def test_a_worker_missing_a_shard_or_holding_a_cut_one_is_refused(tmp_path: Path) -> None:
    head = write_snapshot(tmp_path / "head", SHARDS)
    driver = model_files.measure_snapshot(str(head), None)
    worker = write_snapshot(tmp_path / "worker", SHARDS)
    os.unlink(worker / "model-00002-of-00002.safetensors")
    with pytest.raises(engine.StartupError, match="differ from the driver's") as refused:
        engine.validate_ranks([rank(1, model_files.measure_snapshot(str(worker), None))], driver)
    assert "model-00002-of-00002.safetensors (missing vs 100 bytes)" in str(refused.value)
    cut = write_snapshot(tmp_path / "cut", SHARDS)
    os.truncate(cut / "model-00001-of-00002.safetensors", 50)
    with pytest.raises(engine.StartupError, match=r"00001-of-00002.safetensors \(50 vs 200"):
        engine.validate_ranks([rank(1, model_files.measure_snapshot(str(cut), None))], driver)


def test_a_dangling_shard_is_refused_and_the_report_crosses_the_wire(tmp_path: Path) -> None:
    head = write_snapshot(tmp_path / "head", SHARDS)
    driver = model_files.measure_snapshot(str(head), None)
    worker = write_snapshot(tmp_path / "worker", SHARDS)
    (worker / "model-00001-of-00002.safetensors").resolve().unlink()
    report = rank(1, model_files.measure_snapshot(str(worker), None))
    # As a headless node sends it to the driver (JSON over its connection).
    received = multinode._report_from_json(multinode._report_to_json(report))
    assert received == report
    with pytest.raises(engine.StartupError, match="dangling symlink"):
        engine.validate_ranks([received], driver)
