"""A server's memory on every node: vLLM's --gpu-memory-utilization and --kv-cache-memory-bytes,
as the config fixes them or, with `auto`, as the memory check chose them (later values)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stacks.plan.later import GPU_MEMORY_UTILIZATION, KV_CACHE_BYTES
from stacks.plan.server_plan import ServerPlan


@dataclass(frozen=True)
class ServerSizing:
    """The server's memory on every node: vLLM's --gpu-memory-utilization and, with
    vllm.kvCache, --kv-cache-memory-bytes (configured, or what the memory check derived)."""

    gpu_memory_utilization: str
    kv_cache_bytes: int | str | None = None  # str: a later value's placeholder

    def flags(self) -> list[str]:
        flags = ["--gpu-memory-utilization", self.gpu_memory_utilization]
        if self.kv_cache_bytes is not None:
            flags += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        return flags


def fixed_sizing(plan: ServerPlan) -> ServerSizing | None:
    """The sizing the config gives before the memory check ran (which still checks it fits);
    None when `auto` derives a part of it."""
    vllm = plan.served.settings
    if vllm.gpu_memory_utilization == "auto" or vllm.kv_cache == "auto":
        return None
    return ServerSizing(str(vllm.gpu_memory_utilization), vllm.kv_cache)


def server_sizing(plan: ServerPlan) -> ServerSizing:
    """The sizing vLLM's flags carry: the configured one, or with `auto` the memory check's
    (its later values, stacks/plan/later.py)."""
    fixed = fixed_sizing(plan)
    if fixed is not None:
        return fixed
    kv_cache = None
    if plan.served.settings.kv_cache is not None:
        kv_cache = plan.later(KV_CACHE_BYTES).text
    return ServerSizing(plan.later(GPU_MEMORY_UTILIZATION).text, kv_cache)


def sizing_values(sizing: ServerSizing) -> dict[str, str]:
    """A sizing the memory check chose, as the later values `server_sizing` placed."""
    values = {GPU_MEMORY_UTILIZATION.name: sizing.gpu_memory_utilization}
    if sizing.kv_cache_bytes is not None:
        values[KV_CACHE_BYTES.name] = str(sizing.kv_cache_bytes)
    return values


def checked_sizing(sizing: Mapping[str, Any]) -> ServerSizing:
    """The sizing the memory check chose (its `memory` output)."""
    kv_cache = sizing.get("kvCache")
    return ServerSizing(
        str(sizing["gpuMemoryUtilization"]),
        int(kv_cache["kvCacheBytes"]) if isinstance(kv_cache, Mapping) else None,
    )
