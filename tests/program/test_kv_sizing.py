"""kv_sizing.py (vllm.kvCache): the KV cache's bytes from the model's config.json, its weights
and the memory check's budget; pure functions table-tested, then a snapshot on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.program.scripting import load

GIB = 1024**3


kv = load("kv_sizing")

# Shapes of real configs (the fields vLLM reads), trimmed.
LLAMA_70B = {  # GQA: 8 KV heads of 128, 80 layers, bf16
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "hidden_size": 8192, "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
}  # fmt: skip
QWEN3_NEXT = {  # hybrid: every 4th layer full attention (2 KV heads of 256), the rest linear
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "hidden_size": 2048, "full_attention_interval": 4,
    "torch_dtype": "bfloat16", "max_position_embeddings": 262144,
}  # fmt: skip
GPT_OSS = {  # alternating sliding (window 128) and full attention, 8 KV heads of 64
    "num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_size": 2880, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 2, "torch_dtype": "bfloat16",
}  # fmt: skip
DEEPSEEK_MLA = {  # one latent of 512 + 64 per layer, never split across ranks
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16",
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "tp", "pp", "dtype", "full", "sliding", "window"),
    [
        # 80 layers x 2 (K and V) x 8 heads x 128 x 2 bytes, the heads split over 2 ranks.
        (LLAMA_70B, 1, 1, "auto", 80 * 2 * 8 * 128 * 2, 0, 0),
        (LLAMA_70B, 2, 1, "auto", 80 * 2 * 4 * 128 * 2, 0, 0),
        (LLAMA_70B, 2, 1, "fp8", 80 * 2 * 4 * 128 * 1, 0, 0),
        # Pipeline stages hold half the layers each.
        (LLAMA_70B, 1, 2, "auto", 40 * 2 * 8 * 128 * 2, 0, 0),
        # More ranks than KV heads: each rank keeps a whole head (vLLM replicates them).
        (LLAMA_70B, 16, 1, "auto", 80 * 2 * 1 * 128 * 2, 0, 0),
        # Only the 12 full-attention layers of 48 hold KV per token.
        (QWEN3_NEXT, 2, 1, "auto", 12 * 2 * 1 * 256 * 2, 0, 0),
        (GPT_OSS, 1, 1, "auto", 2 * 2 * 8 * 64 * 2, 2 * 2 * 8 * 64 * 2, 128),
        # MLA: the latent, not doubled, not split by tensor parallelism.
        (DEEPSEEK_MLA, 2, 1, "auto", 61 * (512 + 64) * 2, 0, 0),
        (DEEPSEEK_MLA, 2, 1, "fp8", 61 * (512 + 64) * 1, 0, 0),
    ],
)
def test_bytes_per_token_follow_vllms_layout(
    config: dict[str, Any], tp: int, pp: int, dtype: str, full: int, sliding: int, window: int
) -> None:
    dtype_bytes = kv.cache_dtype_bytes(config, dtype)
    assert kv.kv_shape(config, tp, pp, dtype_bytes) == kv.KvShape(full, sliding, window)


def test_a_multimodal_config_is_sized_by_its_language_model() -> None:
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": QWEN3_NEXT}
    assert kv.text_config(config) is QWEN3_NEXT


def test_a_sliding_layer_holds_at_most_its_window() -> None:
    shape = kv.KvShape(full_bytes=10, sliding_bytes=3, window=128)
    assert shape.for_request(100) == 10 * 100 + 3 * 100
    assert shape.for_request(4096) == 10 * 4096 + 3 * 128


def size(**overrides: Any) -> dict[str, Any]:
    """A Llama-70B-shaped model on two GPUs: 140 GiB of weights, 70 per GPU, 100 GiB budget."""
    args: dict[str, Any] = {
        "config": LLAMA_70B, "weights_bytes": 140 * GIB, "budget_bytes": 100 * GIB,
        "reserve_bytes": 6 * GIB, "requested": "auto", "tensor_parallel": 2,
        "pipeline_parallel": 1, "max_model_len": 32768, "kv_cache_dtype": "auto",
    }  # fmt: skip
    return dict(kv.size_kv_cache(**{**args, **overrides}))


def test_auto_gives_the_cache_what_the_weights_and_the_reserve_leave() -> None:
    result = size()
    assert result["kvCacheBytes"] == (100 - 70 - 6) * GIB
    per_token = 80 * 2 * 4 * 128 * 2
    assert result["bytesPerToken"] == per_token
    # Whole blocks of 16 tokens (vLLM before 0.34): 157286 tokens' bytes hold 157280 in blocks.
    assert result["tokens"] == 24 * GIB // (per_token * 16) * 16 == 157280
    assert result["fullLengthRequests"] == round(24 * GIB / (per_token * 32768), 1)
    assert (result["mode"], result["weightsPerGpuGib"], result["maxModelLen"]) == (
        "auto",
        70,
        32768,
    )


def test_without_max_model_len_the_models_own_maximum_is_checked() -> None:
    assert size(max_model_len=0)["maxModelLen"] == 131072


def test_bytes_that_fit_are_kept_and_bytes_that_do_not_are_refused_with_what_fits() -> None:
    assert size(requested=str(20 * GIB))["kvCacheBytes"] == 20 * GIB
    with pytest.raises(kv.Refused) as refused:
        size(requested=str(30 * GIB))
    assert refused.value.problem == (
        "vllm.kvCache 30.0 GiB does not fit: 100.0 GiB for the server per node, less 70.0 GiB of "
        "weights per GPU and 6.0 GiB for activations and CUDA graphs leaves 24.0 GiB"
    )
    assert "lower vllm.kvCache or set it to auto" in refused.value.cause


def test_a_cache_that_cannot_hold_one_full_request_is_refused_before_vllm_would() -> None:
    # 2 GiB left; one request of 131072 tokens needs 20 GiB on each GPU.
    with pytest.raises(kv.Refused) as refused:
        size(budget_bytes=78 * GIB, max_model_len=131072)
    problem = refused.value.problem
    assert (
        "cannot hold one request of 131072 tokens (20.0 GiB in blocks of 16); about 13104 tokens "
        "fit" in problem
    )
    assert "set vllm.maxModelLen lower" in refused.value.cause
    # Weights that leave nothing at all: refused too, never a negative size.
    with pytest.raises(kv.Refused, match=r"the KV cache \(0\.0 GiB"):
        size(budget_bytes=60 * GIB)


def snapshot(tmp_path: Path, config: dict[str, Any], weights: dict[str, int]) -> Path:
    """An HF-cache-shaped snapshot: files linked to sparse blobs of the given sizes."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / ("c" * 40)
    blobs.mkdir()
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    for name, length in weights.items():
        blob = blobs / name.replace("/", "_")
        with blob.open("wb") as handle:
            handle.truncate(length)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(blob)
    return snap


def size_snapshot(snap: Path, **flags: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "snapshot": snap, "budget_bytes": 100 * GIB, "reserve_bytes": 6 * GIB,
        "requested": "auto", "tensor_parallel": 2, "pipeline_parallel": 1,
        "max_model_len": 32768, "kv_cache_dtype": "auto", **flags,
    }  # fmt: skip
    return dict(kv.size_snapshot(**args))


def test_the_snapshot_weights_are_read_through_their_links(tmp_path: Path) -> None:
    snap = snapshot(
        tmp_path,
        LLAMA_70B,
        {"model-00001.safetensors": 70 * GIB, "model-00002.safetensors": 70 * GIB},
    )
    result = size_snapshot(snap)
    assert (result["kvCacheBytes"], result["weightsPerGpuGib"]) == (24 * GIB, 70.0)
    assert kv.summary(result).startswith("KV cache 24.0 GiB per GPU (auto): ")


def test_a_snapshot_that_cannot_be_sized_names_the_problem_and_its_cause(tmp_path: Path) -> None:
    snap = snapshot(tmp_path, LLAMA_70B, {"model.safetensors": 140 * GIB})
    with pytest.raises(kv.Refused) as refused:
        size_snapshot(snap, requested=str(30 * GIB))
    assert refused.value.problem.startswith("vllm.kvCache 30.0 GiB does not fit")
    assert refused.value.cause.startswith("lower vllm.kvCache")
    (snap / "config.json").write_text(json.dumps({"model_type": "unknown"}))
    with pytest.raises(kv.Refused, match=r"config.json lacks what sizes its KV cache \('num_"):
        size_snapshot(snap)
    (snap / "config.json").unlink()
    with pytest.raises(kv.Refused, match=r"cannot read the model's config\.json") as refused:
        size_snapshot(snap)
    assert "the snapshot is incomplete" in refused.value.cause


BLOCKS = [
    # (tokens, block size, tokens allocated): vLLM allocates whole blocks of the cache.
    ("a whole number of blocks", 32768, 64, 32768),
    ("one token over", 32769, 64, 32832),
    ("one token over, old default", 32769, 16, 32784),
    ("shorter than a block", 5, 64, 64),
    ("per token (no blocks)", 32769, 1, 32769),
]  # fmt: skip


@pytest.mark.parametrize(("tokens", "block", "allocated"), [c[1:] for c in BLOCKS],
                         ids=[c[0] for c in BLOCKS])  # fmt: skip
def test_a_request_takes_whole_blocks(tokens: int, block: int, allocated: int) -> None:
    shape = kv.KvShape(full_bytes=10, sliding_bytes=3, window=100)
    sliding = -(-min(tokens, 100) // block) * block
    assert shape.for_request(tokens, block) == 10 * allocated + 3 * sliding


def test_a_cache_that_holds_the_tokens_but_not_their_64_token_blocks_is_refused() -> None:
    """vLLM 0.34's default block size: a length vLLM would refuse at start after loading."""
    per_token = 80 * 2 * 4 * 128 * 2  # 160 KiB: a 64-token block is 10 MiB
    exact = str(per_token * 32800)  # 32800 tokens' bytes: 2050 blocks of 16, 512.5 of 64
    assert size(requested=exact, max_model_len=32800, block_size=16)["tokens"] == 32800
    with pytest.raises(kv.Refused) as refused:
        size(requested=exact, max_model_len=32800, block_size=64)
    assert "cannot hold one request of 32800 tokens" in refused.value.problem
    assert "in blocks of 64); about 32768 tokens fit" in refused.value.problem
    assert size(requested=exact, max_model_len=32768, block_size=64)["blockSize"] == 64
