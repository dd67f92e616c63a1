"""The copies' decisions, apart from the bytes that move (copy_engine.py reads the facts, runs
these, then moves the bytes): what each worker keeps, resumes and is sent of the weights and of
the image, which blobs a relay chain carries, and which workers an image chain takes. Facts in,
plan out (with the reason the step prints), so they are table-tested
(tests/program/test_copy_plan.py). Standard library only: it runs with the head's own python3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# An LFS blob is named by its sha256: a part of it can be completed and checked. A git blob
# (sha1-named) is small: sent again rather than resumed.
LFS_NAME = re.compile(r"[0-9a-f]{64}")


@dataclass
class BlobPlan:
    kept: list[str] = field(default_factory=list)
    resumed: dict[str, int] = field(default_factory=dict)  # name -> bytes the worker has
    whole: list[str] = field(default_factory=list)
    to_send: int = 0


def plan_blobs(head: dict[str, int], worker: dict[str, int]) -> BlobPlan:
    """Kept: whole on the worker. Resumed: an LFS blob held in part. Sent whole: the rest (a
    blob the worker lacks, holds more of than the head has, or a git blob held in part)."""
    plan = BlobPlan()
    for name in sorted(head):
        want, have = head[name], worker.get(name, 0)
        if have == want:
            plan.kept.append(name)
        elif 0 < have < want and LFS_NAME.fullmatch(name):
            plan.resumed[name] = have
            plan.to_send += want - have
        else:
            plan.whole.append(name)
            plan.to_send += want
    return plan


def chain_blobs(head: dict[str, int], members: list[dict[str, int]]) -> list[str]:
    """The blobs a relay chain carries: those no member holds any part of. A blob one member
    holds in part is left to the members' own steps (resumed there, sent whole to the others),
    so no member's part is overwritten by the stream."""
    held = {name for member in members for name, size in member.items() if size > 0}
    return [name for name in sorted(head) if name not in held]


@dataclass
class ImageChain:
    members: list[int] = field(default_factory=list)  # positions, 1-based
    skipped: dict[int, str] = field(default_factory=dict)  # position -> why
    least: int = 0  # the leading layers every member holds: the stream leaves them out
    zstd: bool = True  # every member can unpack zstd


def image_chain(facts: list[str]) -> ImageChain:
    """Which workers an image chain takes, from each one's fact: `unreachable`, `has` (the
    image), `staged` (a copy cut earlier: its own step resumes it), or `HELD zstd|plain`."""
    chain = ImageChain()
    held: list[int] = []
    for position, line in enumerate(facts, start=1):
        words = line.split()
        fact = words[0] if words else "unreachable"
        if not fact.isdigit():
            known = fact in ("has", "staged")
            chain.skipped[position] = fact if known else "unreachable"
            continue
        chain.members.append(position)
        held.append(int(fact))
        chain.zstd = chain.zstd and len(words) > 1 and words[1] == "zstd"
    chain.least = min(held) if held else 0
    return chain


@dataclass
class ImageCopy:
    """One worker's image copy: what the stream leaves out, and why."""

    kept_layers: int = 0
    staged_whole: list[str] = field(default_factory=list)
    staged_parts: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (have, want)
    why: str = ""


def image_copy(
    layers: int, held: int, index: dict[str, object] | None, staged: dict[str, int]
) -> ImageCopy:
    """`held`: the image's leading layers the worker holds as the same chain (image_layers.py
    held); `index`: the head's saved stream's members and sizes, None when there is none;
    `staged`: what a cut copy left on the worker. Held layers and members staged whole go as
    empty files (`docker load` skips the first, image_stage.py receive fills in the second); a
    member staged in part is completed first. Anything else staged (a larger size, a name the
    stream lacks) is sent again."""
    if index is None:
        why = (
            "reading the saved image's members failed: the whole image"
            if held or staged
            else f"it holds none of the image's {layers} layers and nothing staged: the whole image"
        )
        return ImageCopy(why=why)
    sizes = index["sizes"]
    assert isinstance(sizes, dict)
    plan = ImageCopy(kept_layers=held)
    for name, have in sorted(staged.items()):
        want = sizes.get(name)
        if want is None or want == 0 or have > want:
            continue
        if have == want:
            plan.staged_whole.append(name)
        else:
            plan.staged_parts[name] = (have, want)
    said = [f"it holds {held} of the image's {layers} layers" + (": left out" if held else "")]
    if plan.staged_whole or plan.staged_parts:
        said.append(
            f"a copy cut earlier staged {len(plan.staged_whole)} member(s) whole (not sent again)"
            f" and {len(plan.staged_parts)} in part (completed first)"
        )
    plan.why = "; ".join(said)
    return plan
