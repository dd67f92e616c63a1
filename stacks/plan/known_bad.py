"""Kernel and NVIDIA driver releases users reported broken for multi-node vLLM on GB10, each with
its source; preflight refuses a host running one (or warns, with preflight.allowKnownBad).
A stack adds its own with preflight.knownBad."""

from __future__ import annotations

from stacks.config import KnownBadVersion, StackConfig

SHIPPED: tuple[KnownBadVersion, ...] = (
    KnownBadVersion(
        kind="kernel",
        version="7.0.0-1019-nvidia",
        reason=(
            "NCCL fails at init with ibv_reg_mr_iova2 ENOMEM over RoCE, and hosts wedge on "
            "NV_ERR_NO_MEMORY (6.17.0-1032-nvidia works)"
        ),
        source=(
            "eugr/spark-vllm-docker#389, MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks#14, "
            "NVIDIA/open-gpu-kernel-modules#1358"
        ),
    ),
)


def known_bad(config: StackConfig) -> tuple[KnownBadVersion, ...]:
    return (*SHIPPED, *config.preflight.known_bad)


def known_bad_flag(config: StackConfig) -> str:
    return entries_flag(known_bad(config))


def entries_flag(entries: tuple[KnownBadVersion, ...]) -> str:
    """preflight.sh's --known-bad: `kind|version|reason|source` entries joined by `;` (the
    config refuses those separators in its fields)."""
    return ";".join(f"{e.kind}|{e.version}|{e.reason}|{e.source}" for e in entries)
