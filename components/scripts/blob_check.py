"""The content of an HF cache's blobs against their names, on the host that holds them: a blob's
name is its content's hash (an LFS file's: 64 hex digits, sha256; a small file's: 40, git's
blob sha1), so a copy that arrived with the right size but other bytes is found here.

    python3 blob_check.py BLOBS_DIR [--remove] < names, one a line

Prints each name whose content does not match, one a line (and with --remove deletes it: the
copy that called this wrote it, and a wrong blob of the right size would otherwise be kept by
the next run, which compares sizes). Exit 0 when it could check them all (whatever it found),
2 when a blob is missing or unreadable. Several blobs are hashed at once: hashlib releases the
GIL over large buffers, so threads use the host's cores. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 8 * 1024 * 1024
_SHA256, _GIT_SHA1 = re.compile(r"[0-9a-f]{64}"), re.compile(r"[0-9a-f]{40}")


def content_hash(path: Path, name: str) -> str:
    """The hash `name` is of `path`'s content: sha256, or git's blob sha1 (`blob <size>\\0`
    before the bytes); "" for a name that is neither (nothing to hold it to)."""
    if _SHA256.fullmatch(name):
        digest = hashlib.sha256()
    elif _GIT_SHA1.fullmatch(name):
        digest = hashlib.sha1()
        digest.update(b"blob %d\0" % path.stat().st_size)
    else:
        return ""
    with path.open("rb") as blob:
        while chunk := blob.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def mismatched(blobs: Path, names: list[str]) -> list[str]:
    """The names among `names` whose blob's content is not what the name says."""

    def wrong(name: str) -> bool:
        found = content_hash(blobs / name, name)
        return bool(found) and found != name

    workers = max(1, min(len(names), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return [name for name, bad in zip(names, pool.map(wrong, names), strict=True) if bad]


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2 or argv[1:] not in ([], ["--remove"]):
        print("usage: blob_check.py BLOBS_DIR [--remove] < names", file=sys.stderr)
        return 2
    blobs = Path(argv[0])
    names = [line.strip() for line in sys.stdin if line.strip()]
    # A name is a file name in BLOBS_DIR, never a path.
    if any("/" in name or name in (".", "..") for name in names):
        print("blob_check: a name is not a blob's", file=sys.stderr)
        return 2
    try:
        bad = mismatched(blobs, names)
    except OSError as error:
        print(f"blob_check: {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
    for name in bad:
        print(name)
        if argv[1:] == ["--remove"]:
            (blobs / name).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
