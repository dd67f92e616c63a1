"""Kernel and NVIDIA driver releases users reported broken for multi-node vLLM on GB10, each with
its source; preflight refuses a host running one (or warns, with preflight.allowKnownBad).
A stack adds its own with preflight.knownBad. Known-bad NCCL releases are stacks/nccl_versions.py's:
which NCCL a server loads is known only once the image ran (the image check holds it there)."""

from __future__ import annotations

from stacks.config import KnownBadVersion, StackConfig

# None today. Kernel 7.0's RDMA ENOMEM (7.0.0-1019-nvidia first, eugr/spark-vllm-docker#389) is
# not one release: its cause is Kexec HandOver, on by default in the HWE 7.0 kernels
# (NVIDIA/NV-Kernels#590, #591), so preflight refuses any 7.0-series kernel booted without
# kho=off from its command line and KHO's state (components/scripts/host_rules.py).
SHIPPED: tuple[KnownBadVersion, ...] = ()


def known_bad(config: StackConfig) -> tuple[KnownBadVersion, ...]:
    """The kernels and drivers preflight refuses: the shipped ones and the stack's own."""
    return tuple(e for e in (*SHIPPED, *config.preflight.known_bad) if e.kind != "nccl")


def known_bad_flag(config: StackConfig) -> str:
    return entries_flag(known_bad(config))


def entries_flag(entries: tuple[KnownBadVersion, ...]) -> str:
    """preflight.sh's --known-bad: `kind|version|reason|source` entries joined by `;` (the
    config refuses those separators in its fields)."""
    return ";".join(f"{e.kind}|{e.version}|{e.reason}|{e.source}" for e in entries)
