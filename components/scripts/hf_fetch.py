"""Runs inside the serving image on the head: make the snapshot complete in the HF cache.

    hf_fetch.py MODEL REVISION PIN INCLUDE EXCLUDE
PIN is the stack's record of the commit an earlier fetch resolved REVISION to ("model revision
commit", or ""): a moved branch never changes a deployed model (revision_to_fetch). INCLUDE and
EXCLUDE are the model's patterns, JSON lists, passed to the hub client as its allow and ignore
patterns (hub_filter). The last stdout line is `fetched COMMIT`; everything else goes to stderr.

The HF token arrives on stdin (never argv or env). An already complete snapshot is used as is,
without network access, so re-runs are cheap and offline hosts work. Mounted alone into the
container (weights-fetch.sh): it imports nothing of ours (no hostlib.py).
"""

import json
import os
import re
import sys
from pathlib import Path

COMMIT = re.compile(r"[0-9a-f]{40}")


def revision_to_fetch(model: str, revision: str, pin: str, cached: str) -> str:
    """What to fetch for `model` at the configured `revision`. `pin`: the stack's record
    ("model revision commit") of what an earlier fetch resolved; `cached`: the commit the head's
    cache has for `revision` (its refs/<revision>: a fetch interrupted before the pin was
    recorded, or a deployment made before pins). Only a revision never resolved here is resolved
    at the hub, so a branch that moves between two fetches is not followed."""
    if COMMIT.fullmatch(revision):
        return revision
    fields = pin.split()
    if len(fields) == 3 and fields[:2] == [model, revision] and COMMIT.fullmatch(fields[2]):
        return fields[2]
    if COMMIT.fullmatch(cached):
        return cached
    return revision


class NotACommit(Exception):
    """A refs file that names no commit: something other than the hub client wrote it."""


def ref_commit(ref: str, text: str) -> str:
    """The commit a refs file's `text` names ("" for an empty file, as a write cut short
    leaves); anything else is refused: the hub client would join it to `snapshots/` as is, so
    `../../x` would name a path outside the snapshots."""
    text = text.strip()
    if text and not COMMIT.fullmatch(text):
        shown = "".join(c if c.isprintable() else "?" for c in text[:60])
        raise NotACommit(f"{ref} holds {shown!r}, not a commit")
    return text


def cached_ref(model: str, revision: str) -> str:
    """The commit the HF cache's refs/<revision> names for `model` ("" when there is none)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    ref = Path(HF_HUB_CACHE) / f"models--{model.replace('/', '--')}" / "refs" / revision
    try:
        with ref.open("rb") as file:
            text = file.read(200).decode(errors="replace")
    except OSError:
        return ""
    return ref_commit(f"refs/{revision} of {model} in the HF cache", text)


def record_ref(model: str, revision: str, commit: str) -> None:
    """Point refs/<revision> at the commit fetched, as the hub client does after resolving it:
    vLLM (`--revision REVISION`, offline), the copies and the receipt then all find this
    commit, whatever the branch's head is now."""
    from huggingface_hub.constants import HF_HUB_CACHE

    if revision == commit:
        return
    ref = Path(HF_HUB_CACHE) / f"models--{model.replace('/', '--')}" / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)


def hub_filter(include: str, exclude: str) -> dict[str, list[str] | None]:
    """The model's patterns (JSON lists) as snapshot_download's allow_patterns and
    ignore_patterns: the hub client matches them itself (huggingface_hub/utils/_paths.py
    filter_repo_objects), on the download and on the cache check alike, whose completeness it
    judges by the files the patterns keep, so widening them fetches what was left out. No
    patterns is None: the client's empty allow list would keep nothing."""
    return {
        "allow_patterns": json.loads(include or "[]") or None,
        "ignore_patterns": json.loads(exclude or "[]") or None,
    }


def main() -> int:
    model, revision, pin = sys.argv[1], sys.argv[2], sys.argv[3]
    patterns = hub_filter(sys.argv[4], sys.argv[5])
    token = sys.stdin.read().strip() or None
    from huggingface_hub import snapshot_download

    try:
        cached = cached_ref(model, revision)
    except NotACommit as error:
        print(error, file=sys.stderr)
        return 1
    wanted = revision_to_fetch(model, revision, pin, cached)
    if wanted != revision:
        print(f"{model}@{revision} is pinned to {wanted} here", file=sys.stderr)
    try:
        path = snapshot_download(model, revision=wanted, local_files_only=True, **patterns)
        print(f"complete in cache: {path}", file=sys.stderr)
    except Exception as missing:
        print(f"not complete in cache ({type(missing).__name__}); downloading", file=sys.stderr)
        os.environ.pop("HF_HUB_OFFLINE", None)
        try:
            path = snapshot_download(model, revision=wanted, token=token, **patterns)
        except Exception as error:
            message = str(error).replace(token, "***") if token else str(error)
            print(
                f"download of {model}@{wanted} failed: {type(error).__name__}: {message}",
                file=sys.stderr,
            )
            return 1
        print(f"downloaded to {path}", file=sys.stderr)
    commit = Path(path).name
    record_ref(model, revision, commit)
    sys.stderr.flush()
    print(f"fetched {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
