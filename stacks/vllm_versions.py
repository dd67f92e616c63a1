"""What changed between vLLM releases that a stack's settings can meet: the variables a release
removed, and the KV cache's default block size. The image's vLLM is known only during `up`, from
its image facts (components/scripts/image_facts.py): the plan passes the rows a stack's settings
match to that step, which refuses them against the image's version; the block size follows the
version the same step reports (stacks/plan/image.py kv_block_size).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Removal:
    """A variable a vLLM release removed: a name, or a prefix ending in `*` for a family."""

    name: str
    version: str  # the first release without it
    what: str  # what it was
    fix: str  # what to do instead

    def matches(self, key: str) -> bool:
        if self.name.endswith("*"):
            return key.startswith(self.name[:-1])
        return key == self.name


# One row per removal, the release that removed it, and why (vLLM's release notes).
REMOVED_ENV = (
    # 0.33 removes the legacy Ray executor (compiled graphs and SPMD workers), and with it every
    # VLLM_USE_RAY_* switch; `--distributed-executor-backend ray` is the Ray executor kept.
    Removal(
        "VLLM_USE_RAY_*",
        "0.33",
        "a switch of the legacy Ray executor",
        "remove it (the Ray executor kept needs none), or use an image of vLLM 0.32 or older",
    ),
    # 0.34 removes Model Runner V1: nothing reads the switch any more.
    Removal(
        "VLLM_USE_V1",
        "0.34",
        "Model Runner V1's switch",
        "remove it (vLLM 0.34 has one model runner), or use an image of vLLM 0.33 or older",
    ),
)


def removed_env(key: str) -> Removal | None:
    """The row that removed variable `key`, if any."""
    return next((row for row in REMOVED_ENV if row.matches(key)), None)


def release(version: str) -> tuple[int, ...] | None:
    """`0.34.0rc1`, `0.34.1.dev5+g...` -> (0, 34, 1): the release numbers a version starts with
    (a pre-release or a development build of 0.34 already has 0.34's changes)."""
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if found is None:
        return None
    return tuple(int(part) for part in found.groups(default="0"))


def at_least(version: str, floor: str) -> bool:
    have, need = release(version), release(floor)
    return have is not None and need is not None and have >= need


# vLLM's default KV cache block size on CUDA (tokens per block), by the first release that has
# it: 0.34 moves it from 16 to 64 (vLLM 0.34's release notes). `--block-size` in extraArgs
# overrides it.
BLOCK_SIZES = (("0.34", 64), ("0", 16))


def default_block_size(version: str) -> int:
    """The block size `vllm serve` uses on CUDA when no `--block-size` is given; an unknown
    version (no vLLM found: the image check refuses it) is read as an old one."""
    return next(size for floor, size in BLOCK_SIZES if at_least(version, floor) or floor == "0")
