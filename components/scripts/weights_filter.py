"""A model's `include`/`exclude` patterns, matched as the Hugging Face Hub client matches
`snapshot_download(allow_patterns=, ignore_patterns=)`, so the files counted and copied on the
hosts are the files the fetch brought. The one place the patterns are matched outside the hub
client: the snapshot's manifest (snapshot.sh, through `count`) and the weights copy's file list
(copy_weights.py) use it. Standard library only.

    weights_filter.py count INCLUDE EXCLUDE
reads `SIZE PATH` records, each ended by a NUL (`find -L SNAPSHOT -type f -printf '%s %P\\0'`),
and prints `FILES BYTES` of those kept. INCLUDE and EXCLUDE are JSON lists of patterns.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from fnmatch import fnmatchcase


# huggingface_hub/utils/_paths.py `_normalize_separators`: `\` is a path separator, never an
# fnmatch escape, in patterns and paths alike.
def _normalized(value: str) -> str:
    return value.replace("\\", "/")


# huggingface_hub/utils/_paths.py `_add_wildcard_to_directories`: a pattern ending in "/" names
# a directory, and gets "*" appended (fnmatch's `*` matches "/", so its subdirectories too).
def _pattern(pattern: str) -> str:
    pattern = _normalized(pattern)
    return pattern + "*" if pattern.endswith("/") else pattern


def kept(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether the file at `path` (relative to the snapshot, `/`-separated) is fetched and
    copied. huggingface_hub/utils/_paths.py `filter_repo_objects`: case-sensitive `fnmatchcase`,
    where `*` matches across "/"; with any `include`, a path must match one of them, then it must
    match no `exclude`. No patterns (an empty list): everything (hf_fetch.py passes None then,
    since the hub client's empty allow list would keep nothing)."""
    path = _normalized(path)
    if include and not any(fnmatchcase(path, _pattern(p)) for p in include):
        return False
    return not any(fnmatchcase(path, _pattern(p)) for p in exclude)


def count(records: bytes, include: Sequence[str], exclude: Sequence[str]) -> tuple[int, int]:
    """The files and bytes kept of `SIZE PATH\\0` records."""
    files = size = 0
    for record in records.split(b"\0"):
        if not record:
            continue
        length, _, path = record.decode("utf-8", "surrogateescape").partition(" ")
        if kept(path, include, exclude):
            files += 1
            size += int(length)
    return files, size


def patterns(text: str) -> list[str]:
    """A JSON list of patterns, as the steps pass them ("" or "[]": none)."""
    value = json.loads(text or "[]")
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"not a JSON list of patterns: {text!r}")
    return value


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "count":
        print(__doc__, file=sys.stderr)
        return 2
    files, size = count(sys.stdin.buffer.read(), patterns(argv[1]), patterns(argv[2]))
    print(f"{files} {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
