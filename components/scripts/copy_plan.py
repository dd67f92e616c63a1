"""The copies' decisions, apart from the bytes that move (weights-sync.sh and image-sync.sh run
them): what each worker keeps, resumes and is sent of the weights, which blobs a relay chain
carries, and which workers an image chain takes. Facts in, plan out, so they are table-tested
(tests/program/test_copy_plan.py).

    copy_plan.py blobs HEAD_SIZES WORKER_SIZES
        > `kept NAME`, `resume NAME HAVE`, `send NAME` lines, then `total BYTES_TO_SEND`
    copy_plan.py chain-blobs HEAD_SIZES MEMBER_SIZES...
        > `send NAME` lines: the blobs no chain member holds any of, then `total BYTES`
    copy_plan.py image-chain MEMBER_FACT...   (each a file: image-sync.sh image_fact's line)
        > `member POSITION` or `skip POSITION REASON` a worker (1-based, in the chain's order),
          then `least HELD` (the leading layers every member holds) and `zstd yes|no`

A sizes file holds `NAME SIZE` lines (the head's: every blob of the revision; a worker's: what
it holds of each, 0 or absent when none). Standard library only: it runs with the head's own
python3.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# An LFS blob is named by its sha256: a part of it can be completed and checked. A git blob
# (sha1-named) is small: sent again rather than resumed.
LFS_NAME = re.compile(r"[0-9a-f]{64}")


@dataclass
class BlobPlan:
    kept: list[str] = field(default_factory=list)
    resumed: dict[str, int] = field(default_factory=dict)  # name -> bytes the worker has
    whole: list[str] = field(default_factory=list)
    to_send: int = 0


def read_sizes(path: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            sizes[parts[0]] = int(parts[1])
    return sizes


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


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "blobs":
        head = read_sizes(Path(argv[1]))
        plan = plan_blobs(head, read_sizes(Path(argv[2])))
        lines = [f"kept {name}" for name in plan.kept]
        lines += [f"resume {name} {have}" for name, have in plan.resumed.items()]
        lines += [f"send {name}" for name in plan.whole]
        print("\n".join([*lines, f"total {plan.to_send}"]))
        return 0
    if len(argv) >= 2 and argv[0] == "chain-blobs":
        head = read_sizes(Path(argv[1]))
        names = chain_blobs(head, [read_sizes(Path(path)) for path in argv[2:]])
        total = sum(head[name] for name in names)
        print("\n".join([*(f"send {name}" for name in names), f"total {total}"]))
        return 0
    if argv and argv[0] == "image-chain":
        chain = image_chain([Path(path).read_text().strip() for path in argv[1:]])
        lines = [f"member {position}" for position in chain.members]
        lines += [f"skip {position} {why}" for position, why in chain.skipped.items()]
        lines += [f"least {chain.least}", f"zstd {'yes' if chain.zstd else 'no'}"]
        print("\n".join(lines))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
