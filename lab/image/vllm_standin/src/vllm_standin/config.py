"""Everything `vllm serve` was told, from flags and environment, resolved once."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass

from vllm_standin import VERSION

DEFAULT_PLACEMENT_TIMEOUT_S = 60.0
DEFAULT_WORKER_START_TIMEOUT_S = 120.0
DEFAULT_HEALTH_INTERVAL_S = 5.0
DEFAULT_HEALTH_TIMEOUT_S = 10.0
# torch.distributed's default store timeout for NCCL process groups (10 min, inferred from torch).
DEFAULT_RENDEZVOUS_TIMEOUT_S = 600.0


def env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number of seconds, got {raw!r}") from None


@dataclass(frozen=True)
class ServeConfig:
    model: str
    revision: str | None
    served_model_names: tuple[str, ...]
    host: str | None
    port: int
    api_key: str | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    executor_backend: str
    max_model_len: int | None
    access_log: bool
    non_default_args: dict[str, object]
    placement_timeout_s: float
    worker_start_timeout_s: float
    health_interval_s: float
    health_timeout_s: float
    # Multi-node without Ray (the mp executor): this node's place in the group.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    headless: bool = False
    rendezvous_timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S
    compile_key: str = ""
    kv_cache_memory_bytes: int | None = None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        model = args.model_tag or args.model_flag
        world_size = args.tensor_parallel_size * args.pipeline_parallel_size
        return cls(
            model=model,
            revision=args.revision,
            served_model_names=tuple(args.served_model_name or [model]),
            host=args.host,
            port=args.port,
            # vLLM: `args.api_key or envs.VLLM_API_KEY`.
            api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            executor_backend=choose_executor_backend(
                args.distributed_executor_backend, world_size, args.nnodes
            ),
            max_model_len=args.max_model_len,
            access_log=args.uvicorn_log_level in ("info", "debug", "trace"),
            non_default_args=non_default_args(args),
            placement_timeout_s=env_seconds(
                "VLLM_STANDIN_PLACEMENT_TIMEOUT", DEFAULT_PLACEMENT_TIMEOUT_S
            ),
            worker_start_timeout_s=env_seconds(
                "VLLM_STANDIN_WORKER_START_TIMEOUT", DEFAULT_WORKER_START_TIMEOUT_S
            ),
            health_interval_s=env_seconds(
                "VLLM_STANDIN_HEALTH_INTERVAL", DEFAULT_HEALTH_INTERVAL_S
            ),
            health_timeout_s=env_seconds("VLLM_STANDIN_HEALTH_TIMEOUT", DEFAULT_HEALTH_TIMEOUT_S),
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
            headless=args.headless,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes,
            # --distributed-timeout-seconds bounds the rendezvous as vLLM's does; unset,
            # torch's default (the lab's tests shorten it with VLLM_STANDIN_RENDEZVOUS_TIMEOUT).
            rendezvous_timeout_s=(
                float(args.distributed_timeout_seconds)
                if args.distributed_timeout_seconds
                else env_seconds("VLLM_STANDIN_RENDEZVOUS_TIMEOUT", DEFAULT_RENDEZVOUS_TIMEOUT_S)
            ),
            compile_key=compile_key(args),
        )


def choose_executor_backend(requested: str | None, world_size: int, nnodes: int = 1) -> str:
    """vLLM's default: one process for world size 1; several nodes without Ray mean `mp`
    (config/parallel.py: `elif current_platform.is_cuda() and self.nnodes > 1: backend =
    "mp"`); on a GPU-less host more ranks otherwise mean Ray."""
    if requested:
        return requested
    if world_size == 1:
        return "uni"
    return "mp" if nnodes > 1 else "ray"


def non_default_args(args: argparse.Namespace) -> dict[str, object]:
    """What vLLM logs as `non-default args` at start-up (secrets masked)."""
    from vllm_standin.cli import build_parsers

    _, serve_parser = build_parsers()
    defaults = vars(serve_parser.parse_args(["placeholder-model"]))
    changed: dict[str, object] = {}
    for name, value in vars(args).items():
        if name in ("command",) or defaults.get(name, None) == value:
            continue
        changed[name] = "<redacted>" if name == "api_key" and value else value
    return changed


# What vLLM's compile-cache key hashes, of what the stand-in parses (vllm/config/vllm.py
# VllmConfig.compute_hash: the model, cache, parallel, scheduler and compilation configs, and
# vLLM's version): not --gpu-memory-utilization (CacheConfig leaves it out), nor the API
# server's own flags (host, port, served names, API key, log levels).
COMPILE_KEY_ARGS = (
    "revision",
    "max_model_len",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "enforce_eager",
    "max_num_seqs",
    "max_num_batched_tokens",
)


def compile_key(args: argparse.Namespace) -> str:
    """The compile cache's directory name for these arguments: 10 hex digits, as vLLM's."""
    factors = {name: getattr(args, name) for name in COMPILE_KEY_ARGS}
    factors["model"] = args.model_tag or args.model_flag
    factors["version"] = VERSION
    text = json.dumps(factors, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]
