"""vllm_weights.py: the files of a snapshot vLLM loads, which the memory check sizes (kv_sizing.py),
on the snapshot shapes of tests/weight_files.py (held to real vLLM in
tests/standin/test_conformance.py); and the memory check's refusal when the head would load
other weights than the workers hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.weight_files import SHAPES, Shape, loaded_bytes, write_snapshot

from .scripting import load

vllm_weights = load("vllm_weights")
kv = load("kv_sizing")
weights_filter = load("weights_filter")
GIB = 1024**3
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "num_attention_heads": 64,
    "num_key_value_heads": 8, "num_hidden_layers": 80, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_the_files_vllm_loads(shape: Shape, tmp_path: Path) -> None:
    snapshot = write_snapshot(tmp_path, shape)
    loaded = vllm_weights.loaded_weight_files(snapshot, shape.load_format)
    assert tuple(p.name for p in loaded) == shape.loaded
    assert sum(p.stat().st_size for p in loaded) == loaded_bytes(shape)


def test_a_format_without_files_of_its_own_is_sized_as_auto() -> None:
    assert vllm_weights.patterns_of("dummy") == vllm_weights.patterns_of("auto")
    assert vllm_weights.patterns_of("safetensors") == ("*.safetensors",)


def sized(snapshot: Path, include: list[str], exclude: list[str]) -> dict[str, object]:
    result = kv.size_snapshot(
        snapshot=snapshot, budget_bytes=100 * GIB, reserve_bytes=6 * GIB, requested="auto",
        tensor_parallel=2, pipeline_parallel=1, max_model_len=32768, kv_cache_dtype="auto",
        kept=lambda name: weights_filter.kept(name, include, exclude),
    )  # fmt: skip
    return dict(result)


def sparse(snapshot: Path, name: str, size: int) -> None:
    """A weight file of `size` bytes that takes no disk (the memory check only stats it)."""
    (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
    with (snapshot / name).open("wb") as handle:
        handle.truncate(size)


def llama_snapshot(tmp_path: Path) -> Path:
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "config.json").write_text(json.dumps(LLAMA))
    sparse(snapshot, "model-00001.safetensors", 70 * GIB)
    sparse(snapshot, "model-00002.safetensors", 70 * GIB)
    return snapshot


def test_what_vllm_does_not_load_takes_no_kv_cache(tmp_path: Path) -> None:
    """`original/` and a gguf beside the shards (the repo's other copies): before, every
    safetensors below the snapshot was summed and `original/`'s 140 GiB starved the cache."""
    snapshot = llama_snapshot(tmp_path)
    bare = sized(snapshot, [], [])
    sparse(snapshot, "original/consolidated.safetensors", 140 * GIB)
    sparse(snapshot, "model.gguf", 40 * GIB)
    assert sized(snapshot, [], []) == bare
    assert (bare["kvCacheBytes"], bare["weightsPerGpuGib"]) == (24 * GIB, 70.0)


def test_an_excluded_file_the_head_would_load_is_refused(tmp_path: Path) -> None:
    """A shard fetched before `exclude` named it stays in the head's cache (spark-vllm never
    deletes there) and vLLM on the head still loads it; the workers never got it."""
    snapshot = llama_snapshot(tmp_path)
    sparse(snapshot, "model-extra.safetensors", 10 * GIB)
    with pytest.raises(kv.Refused) as refused:
        sized(snapshot, [], ["model-extra.safetensors"])
    assert "model-extra.safetensors" in refused.value.problem
    assert "remove them from the head's snapshot" in refused.value.cause
    # Kept by the patterns, it is sized with the others.
    assert sized(snapshot, [], [])["weightsPerGpuGib"] == 75.0


def test_excluding_what_vllm_does_not_load_changes_nothing(tmp_path: Path) -> None:
    snapshot = llama_snapshot(tmp_path)
    sparse(snapshot, "original/consolidated.safetensors", 140 * GIB)
    assert sized(snapshot, [], ["original/*"]) == sized(snapshot, [], [])
    assert sized(snapshot, ["*.safetensors", "*.json"], []) == sized(snapshot, [], [])


def test_a_snapshot_without_weights_or_with_a_dangling_one_is_refused(tmp_path: Path) -> None:
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "config.json").write_text(json.dumps(LLAMA))
    with pytest.raises(kv.Refused, match="no weights vLLM loads"):
        sized(snapshot, [], [])
    (snapshot / "model.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    with pytest.raises(kv.Refused, match="cannot be read") as refused:
        sized(snapshot, [], [])
    assert "pulumi up --refresh" in refused.value.cause
