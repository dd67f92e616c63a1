"""copy_plan.py: the weights copy's decisions, facts in and plan out (as pyinfra tests its
operations), for every case the lab covers (kept, resumed after a cut, sent whole, relayed)."""

from __future__ import annotations

import pytest

from tests.program.scripting import load

plan = load("copy_plan")

LFS = "a" * 64  # an LFS blob: named by its sha256
LFS2 = "b" * 64
GIT = "c" * 40  # a git blob (config.json, tokenizer files): sha1-named, small
HEAD = {LFS: 8_000_000, LFS2: 4_000_000, GIT: 2_000}


@pytest.mark.parametrize(
    ("worker", "kept", "resumed", "whole", "to_send"),
    [
        # Nothing there: everything goes.
        ({}, [], {}, [LFS, LFS2, GIT], 12_002_000),
        # Up to date: nothing goes.
        (dict(HEAD), [LFS, LFS2, GIT], {}, [], 0),
        # A copy cut midway (the lab's weights cut): the part resumes, the rest goes whole.
        ({LFS: 3_000_000, GIT: 2_000}, [GIT], {LFS: 3_000_000}, [LFS2], 9_000_000),
        # A git blob held in part is small: sent again, not resumed (nothing to check it by).
        ({LFS: 8_000_000, LFS2: 4_000_000, GIT: 1_000}, [LFS, LFS2], {}, [GIT], 2_000),
        # More than the head has (another file under that name): sent whole, not trusted.
        ({LFS: 9_000_000, LFS2: 4_000_000, GIT: 2_000}, [LFS2, GIT], {}, [LFS], 8_000_000),
        # Reported as absent (0 bytes): sent whole.
        ({LFS: 0, LFS2: 4_000_000, GIT: 2_000}, [LFS2, GIT], {}, [LFS], 8_000_000),
    ],
)
def test_each_blob_is_kept_resumed_or_sent_whole(
    worker: dict[str, int], kept: list[str], resumed: dict[str, int], whole: list[str], to_send: int
) -> None:
    result = plan.plan_blobs(HEAD, worker)
    assert (sorted(result.kept), result.resumed, sorted(result.whole)) == (
        sorted(kept),
        resumed,
        sorted(whole),
    )
    assert result.to_send == to_send


@pytest.mark.parametrize(
    ("members", "carried"),
    [
        # Two workers with nothing: the chain carries every blob.
        ([{}, {}], [LFS, LFS2, GIT]),
        # One holds a part of a blob: that blob is left to the members' own steps (the part is
        # resumed there, not overwritten by the stream); the rest rides the chain.
        ([{LFS: 3_000_000}, {}], [LFS2, GIT]),
        # What every member holds whole needs no chain either.
        ([{GIT: 2_000}, {GIT: 2_000, LFS2: 0}], [LFS, LFS2]),
    ],
)
def test_a_relay_chain_carries_the_blobs_no_member_holds(
    members: list[dict[str, int]], carried: list[str]
) -> None:
    assert plan.chain_blobs(HEAD, members) == sorted(carried)


@pytest.mark.parametrize(
    ("facts", "members", "skipped", "least", "zstd"),
    [
        # Three workers with nothing: all in, the whole image (no layer held by all), zstd.
        (["0 zstd", "0 zstd", "0 zstd"], [1, 2, 3], {}, 0, True),
        # An update: the stream leaves out the leading layers every member holds (the least).
        (["5 zstd", "3 zstd", "4 plain"], [1, 2, 3], {}, 3, False),
        # Who has the image or has a cut copy staged (its own step resumes it) stays out; so
        # does one the head cannot reach, or whose probe said nothing. (The containerd store
        # takes the thinned stream too: no fact of its own.)
        (
            ["has", "2 zstd", "staged", "containerd", "unreachable", "", "2 zstd"],
            [2, 7],
            {1: "has", 3: "staged", 4: "unreachable", 5: "unreachable", 6: "unreachable"},
            2,
            True,
        ),
        # A probe answer that is no fact at all counts as unreachable, never as a member.
        (["garbage here"], [], {1: "unreachable"}, 0, True),
    ],
)
def test_an_image_chain_takes_the_workers_that_lack_the_image_and_can_load_it(
    facts: list[str], members: list[int], skipped: dict[int, str], least: int, zstd: bool
) -> None:
    chain = plan.image_chain(facts)
    assert (chain.members, chain.skipped, chain.least, chain.zstd) == (
        members,
        skipped,
        least,
        zstd,
    )


# The head's saved stream: three layers (rootfs order), the config and the manifest.
IMAGE_INDEX = {
    "layers": ["l1/layer.tar", "l2/layer.tar", "l3/layer.tar"],
    "sizes": {
        "l1/layer.tar": 5000,
        "l2/layer.tar": 3000,
        "l3/layer.tar": 1000,
        "config.json": 200,
        "manifest.json": 100,
    },
}


@pytest.mark.parametrize(
    ("held", "index", "staged", "kept", "whole", "parts", "why"),
    [
        # Nothing on the worker: no index is made, the whole image, and it says so.
        (0, None, {}, 0, [], {}, "holds none of the image's 3 layers and nothing staged"),
        # Indexing failed though the worker holds layers: the whole image, and why.
        (2, None, {}, 0, [], {}, "reading the saved image's members failed"),
        # An update: the two layers it holds go as empty files.
        (2, IMAGE_INDEX, {}, 2, [], {}, "holds 2 of the image's 3 layers: left out"),
        # A cut copy: one member staged whole, one in part (completed first); a member the
        # stream lacks, one larger than the head's and an empty one are sent again.
        (
            0,
            IMAGE_INDEX,
            {"l1/layer.tar": 5000, "l2/layer.tar": 1200, "zzz": 10, "l3/layer.tar": 1001},
            0,
            ["l1/layer.tar"],
            {"l2/layer.tar": (1200, 3000)},
            "staged 1 member(s) whole (not sent again) and 1 in part (completed first)",
        ),
        # Held layers and a stage together.
        (1, IMAGE_INDEX, {"l2/layer.tar": 3000}, 1, ["l2/layer.tar"], {}, "holds 1 of"),
    ],
)
def test_an_image_copy_leaves_out_what_the_worker_holds_or_staged_and_says_why(
    held: int,
    index: dict[str, object] | None,
    staged: dict[str, int],
    kept: int,
    whole: list[str],
    parts: dict[str, tuple[int, int]],
    why: str,
) -> None:
    copy = plan.image_copy(3, held, index, staged)
    assert (copy.kept_layers, copy.staged_whole, copy.staged_parts) == (kept, whole, parts)
    assert why in copy.why
