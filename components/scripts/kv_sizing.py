"""vllm.kvCache: the KV cache in bytes per GPU (vLLM's --kv-cache-memory-bytes), from the model's
config.json, the weights vLLM loads from the snapshot (vllm_weights.py) and the budget the memory
check found on every node (memory_plan.py sizes it with `size_snapshot`, which raises Refused when
the cache cannot hold one request of the model's maximum length or does not fit beside the
weights).

Why: on unified memory (GB10) vLLM's profiler measures what is free while the page cache and
other processes move, and can leave the KV cache starved (eugr/spark-vllm-docker PR #286);
NVIDIA's xr-ai (PR #462) sets --kv-cache-memory-bytes instead. With that flag vLLM skips its
own sizing (vllm/v1/worker/gpu_worker.py, determine_available_memory), so the bytes must leave
room for the weights and what the server allocates besides them (`--reserve-bytes`).
Standard library only: it runs with the head's own python3.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vllm_weights

GIB = 1024**3

# vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE: the cache dtypes that take one byte.
ONE_BYTE_CACHE_DTYPES = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"}
MODEL_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# vLLM's KV cache block size on CUDA before 0.34 (64 from 0.34: stacks/vllm_versions.py, which
# the memory check is given it from).
DEFAULT_BLOCK_SIZE = 16
# What multimodal configs call their language model's part (transformers' get_text_config).
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config")


class Refused(Exception):
    """What cannot be served, and its likely cause (the memory check fails with both)."""

    def __init__(self, problem: str, cause: str) -> None:
        super().__init__(problem)
        self.problem, self.cause = problem, cause


@dataclass(frozen=True)
class KvShape:
    """What one token takes in one rank's KV cache: in every full-attention layer, and in every
    sliding-window layer up to its window."""

    full_bytes: int  # per token, the rank's full-attention layers together
    sliding_bytes: int  # per token, the rank's sliding-window layers together
    window: int  # their window in tokens (0: none)

    def for_request(self, tokens: int, block_size: int = 1) -> int:
        """Bytes one request of `tokens` tokens holds in the rank's cache, in whole blocks of
        `block_size` tokens, as vLLM allocates and checks it at start (vllm/v1/kv_cache_interface.py
        FullAttentionSpec.max_memory_usage_bytes: cdiv(max_model_len, block_size) pages)."""
        full = whole_blocks(tokens, block_size)
        sliding = whole_blocks(min(tokens, self.window or tokens), block_size)
        return self.full_bytes * full + self.sliding_bytes * sliding

    def tokens_held(self, kv_bytes: int, block_size: int = 1) -> int:
        """Tokens a cache of `kv_bytes` holds in the full-attention layers: its whole blocks."""
        if not self.full_bytes:
            return 0
        return kv_bytes // (self.full_bytes * block_size) * block_size


def whole_blocks(tokens: int, block_size: int) -> int:
    """`tokens` rounded up to whole blocks, in tokens."""
    return -(-tokens // block_size) * block_size


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a (possibly multimodal) config.json."""
    for key in TEXT_CONFIG_KEYS:
        part = config.get(key)
        if isinstance(part, dict) and part.get("num_hidden_layers"):
            return part
    return config


def cache_dtype_bytes(config: dict[str, Any], kv_cache_dtype: str) -> int:
    """`auto` keeps the model's dtype (vLLM's CacheConfig.cache_dtype)."""
    if kv_cache_dtype in ONE_BYTE_CACHE_DTYPES:
        return 1
    if kv_cache_dtype not in ("", "auto"):
        return MODEL_DTYPE_BYTES.get(kv_cache_dtype, 2)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return MODEL_DTYPE_BYTES.get(dtype, 2)


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """Each layer's attention: `full`, `sliding` or `none` (linear attention and Mamba layers keep
    a fixed state per request, not per token: not counted here)."""
    layers = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        kinds = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding"}
        return [kinds.get(str(t), "none") for t in types]
    interval = config.get("full_attention_interval")  # Qwen3-Next: every Nth layer is full
    if isinstance(interval, int) and interval > 0:
        return ["full" if (i + 1) % interval == 0 else "none" for i in range(layers)]
    return ["full"] * layers


def kv_shape(
    config: dict[str, Any], tensor_parallel: int, pipeline_parallel: int, dtype_bytes: int
) -> KvShape:
    """One rank's share: layers split across pipeline stages; KV heads across tensor-parallel
    ranks, replicated when there are fewer heads than ranks (vLLM's get_num_kv_heads); an MLA
    latent (DeepSeek) is not split."""
    kinds = layer_kinds(config)
    stages = max(pipeline_parallel, 1)
    full = -(-kinds.count("full") // stages)
    sliding = -(-kinds.count("sliding") // stages)
    if config.get("kv_lora_rank"):
        per_layer = (
            int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim", 0))
        ) * dtype_bytes
    else:
        heads = int(config.get("num_attention_heads", 1))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        per_layer = 2 * max(kv_heads // max(tensor_parallel, 1), 1) * head_dim * dtype_bytes
    window = int(config.get("sliding_window") or 0) if sliding else 0
    return KvShape(full * per_layer, sliding * per_layer, window)


def weight_files_bytes(snapshot: Path, load_format: str, kept: Callable[[str], bool]) -> int:
    """The bytes of the weights vLLM loads from the head's snapshot (vllm_weights.py), links
    followed. The workers hold only what the model's include/exclude keep: a file vLLM would load
    on the head that they lack (fetched before the patterns changed) is refused, since the ranks
    would load different weights."""
    try:
        on_head = vllm_weights.loaded_weight_files(snapshot, load_format)
        on_workers = vllm_weights.loaded_weight_files(snapshot, load_format, kept)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise Refused(
            f"vllm.kvCache: cannot list the weights of {snapshot} ({exc!r})",
            "the snapshot or its model.safetensors.index.json is incomplete (run 'pulumi up "
            "--refresh')",
        ) from exc
    differ = sorted({p.name for p in on_head} ^ {p.name for p in on_workers})
    if differ:
        raise Refused(
            f"vLLM would load {', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''} from "
            f"the head's snapshot {snapshot} by other rules than the files the model's "
            "include/exclude keep (what the workers hold)",
            "files fetched before the patterns changed stay in the cache (spark-vllm never "
            "deletes there): remove them from the head's snapshot, or change the patterns so "
            "they keep what vLLM loads (docs/operations.md)",
        )
    if not on_head:
        raise Refused(
            f"vllm.kvCache: {snapshot} holds no weights vLLM loads "
            f"({', '.join(vllm_weights.patterns_of(load_format))} at its top)",
            "the snapshot is incomplete (run 'pulumi up --refresh'), or vllm.extraArgs' "
            "--load-format does not match the model's files",
        )
    try:
        return sum(path.stat().st_size for path in on_head)
    except OSError as exc:
        raise Refused(
            f"vllm.kvCache: a weight file of {snapshot} cannot be read: {exc}",
            "the snapshot is incomplete (run 'pulumi up --refresh')",
        ) from exc


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def size_kv_cache(
    *,
    config: dict[str, Any],
    weights_bytes: int,
    budget_bytes: int,
    reserve_bytes: int,
    requested: str,
    tensor_parallel: int,
    pipeline_parallel: int,
    max_model_len: int,
    kv_cache_dtype: str,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, Any]:
    """The KV cache per GPU for `requested` (`auto`: all the budget leaves; else bytes), and what
    it holds; raises Refused when it does not fit or cannot hold one request of the model's
    maximum length (vLLM refuses that at start, after minutes of loading: here, before)."""
    text = text_config(config)
    shape = kv_shape(
        text, tensor_parallel, pipeline_parallel, cache_dtype_bytes(text, kv_cache_dtype)
    )
    ranks = max(tensor_parallel, 1) * max(pipeline_parallel, 1)
    weights_per_rank = -(-weights_bytes // ranks)
    room = budget_bytes - weights_per_rank - reserve_bytes
    beside = (
        f"{gib(budget_bytes)} for the server per node, less {gib(weights_per_rank)} of weights "
        f"per GPU and {gib(reserve_bytes)} for activations and CUDA graphs"
    )
    if requested == "auto":
        kv_bytes = room
    else:
        kv_bytes = int(requested)
        if kv_bytes > room:
            raise Refused(
                f"vllm.kvCache {gib(kv_bytes)} does not fit: {beside} leaves {gib(max(room, 0))}",
                "lower vllm.kvCache or set it to auto; or raise vllm.gpuMemoryUtilization "
                "(auto: free memory, preflight.dropPageCache: true)",
            )
    length = max_model_len or int(text.get("max_position_embeddings") or 0)
    one_request = shape.for_request(length, block_size) if length else 0
    if kv_bytes <= 0 or kv_bytes < one_request:
        fits = shape.tokens_held(max(kv_bytes, 0), block_size)
        raise Refused(
            f"vllm.kvCache {requested}: the KV cache ({gib(max(kv_bytes, 0))}; {beside}) cannot "
            f"hold one request of {length} tokens ({gib(one_request)} in blocks of "
            f"{block_size}); about {fits} tokens fit",
            "set vllm.maxModelLen lower, give the server more memory (vllm.gpuMemoryUtilization, "
            "free memory), or spread the model over more GPUs",
        )
    tokens = shape.tokens_held(kv_bytes, block_size)
    return {
        "kvCacheBytes": kv_bytes,
        "mode": "auto" if requested == "auto" else "fixed",
        "budgetGib": round(budget_bytes / GIB, 1),
        "weightsPerGpuGib": round(weights_per_rank / GIB, 1),
        "reserveGib": round(reserve_bytes / GIB, 1),
        "bytesPerToken": shape.full_bytes,
        "tokens": tokens,
        "maxModelLen": length,
        "blockSize": block_size,
        "fullLengthRequests": round(kv_bytes / one_request, 1) if one_request else None,
    }


def summary(result: dict[str, Any]) -> str:
    """One line for the user: the cache's size and what it holds."""
    requests = result["fullLengthRequests"]
    held = f" ({requests} requests of {result['maxModelLen']})" if requests is not None else ""
    return (
        f"KV cache {result['kvCacheBytes'] / GIB:.1f} GiB per GPU ({result['mode']}): "
        f"{result['tokens']} tokens{held}; {result['weightsPerGpuGib']} GiB of weights per GPU, "
        f"{result['reserveGib']} GiB reserved, of {result['budgetGib']} GiB"
    )


def size_snapshot(
    *,
    snapshot: Path,
    budget_bytes: int,
    reserve_bytes: int,
    requested: str,
    tensor_parallel: int,
    pipeline_parallel: int,
    max_model_len: int,
    kv_cache_dtype: str,
    load_format: str = "auto",
    kept: Callable[[str], bool] = lambda name: True,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, Any]:
    """size_kv_cache for the snapshot in `snapshot`: its config.json and the weight files vLLM
    loads (with `load_format`, of the files `kept` keeps: weights_filter.kept)."""
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise Refused(
            f"vllm.kvCache: cannot read the model's config.json: {exc}",
            "the snapshot is incomplete (run 'pulumi up --refresh'), or the model has none",
        ) from exc
    weights_bytes = weight_files_bytes(snapshot, load_format, kept)
    try:
        return size_kv_cache(
            config=config,
            weights_bytes=weights_bytes,
            budget_bytes=budget_bytes,
            reserve_bytes=reserve_bytes,
            requested=requested,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
            max_model_len=max_model_len,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(
            f"vllm.kvCache: the model's config.json lacks what sizes its KV cache ({exc})",
            "an architecture spark-vllm does not know: set vllm.kvCache in bytes, or unset it",
        ) from exc
