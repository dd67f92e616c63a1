"""Whether another local user could change what is in a host's state leaf or weights cache, read
before anything is written there (facts.sh runs this from stdin on every run, preview included,
before it reads a receipt). The state holds keys and the scripts the SSH user (in the docker
group: root) runs, and a destroy empties it; whoever may write one of its parents could put a
directory of theirs, or a link to /, in its place.

The rule is OpenSSH's StrictModes for authorized_keys (misc.c `safe_path`): every directory on
the way, the ones links lead through included, is owned by root or the SSH user and writable by
neither its group nor others. Unlike safe_path there is no stop at the home directory: the walk
goes up to /. There is no exception for the sticky bit (/tmp's 1777): it stops others from
removing a name, not from making it first. The state leaf itself, if it is there, is the SSH
user's own real directory, not a link and reached through none (a destroy empties it, and
lib.sh `empty` refuses a path a link leads elsewhere); the cache may lead through links, every
directory on the way held to the rule. What is missing is made later by
`mkdir -p` as the SSH user, below a parent the walk found safe.

    python3 - STATE_LEAF CACHE_DIR   (stdin: this file)
        prints one line per problem and exits 1; prints nothing and exits 0 when both are safe.

Facts (`survey`: lstat along the path) apart from the decision (`problems`), which is
table-tested without a host (tests/program/test_dir_safety.py). Standard library only.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from dataclasses import dataclass
from typing import Literal

Kind = Literal["dir", "link", "followed", "other", "missing"]
MAX_LINKS = 40  # as the kernel's ELOOP limit


@dataclass(frozen=True)
class Entry:
    """One path the walk met: a directory on the way, or what the path ends in."""

    path: str
    kind: Kind
    uid: int = 0
    mode: int = 0


def survey(path: str, follow_last: bool) -> list[Entry]:
    """Every directory the kernel passes through to reach `path` (those a link leads to as
    well), in order, then what `path` names itself: a directory, a link (when not
    `follow_last`), something else, or missing (the walk stops at the first missing name)."""
    entries = [_entry("/")]
    current, todo, links = "/", [p for p in path.split("/") if p], 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            entries.append(_entry(current))
            continue
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            return [*entries, Entry(candidate, "missing")]
        if stat.S_ISLNK(info.st_mode) and (todo or follow_last):
            links += 1
            if links > MAX_LINKS:
                return [*entries, Entry(candidate, "other", info.st_uid, info.st_mode)]
            target = os.readlink(candidate)
            entries.append(Entry(f"{candidate} -> {target}", "followed", info.st_uid, info.st_mode))
            if target.startswith("/"):
                current = "/"
                entries.append(_entry("/"))
            todo = [p for p in target.split("/") if p] + todo
            continue
        if stat.S_ISLNK(info.st_mode):
            return [*entries, Entry(candidate, "link", info.st_uid, info.st_mode)]
        if not stat.S_ISDIR(info.st_mode):
            return [*entries, Entry(candidate, "other", info.st_uid, info.st_mode)]
        current = candidate
        entries.append(Entry(candidate, "dir", info.st_uid, info.st_mode))
    return entries


def _entry(path: str) -> Entry:
    info = os.stat(path)
    return Entry(path, "dir", info.st_uid, info.st_mode)


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _shown(entry: Entry) -> str:
    return f"owner {_owner(entry.uid)}, mode {stat.filemode(entry.mode)}"


def _writable_by_others(entry: Entry) -> bool:
    return bool(entry.mode & (stat.S_IWGRP | stat.S_IWOTH))


@dataclass(frozen=True)
class Target:
    """A directory to check: what it is, the key that sets it, an example of a safe one."""

    what: str  # "the state directory"
    key: str  # "hosts[].stateDir"
    example: str  # "/srv/spark-vllm, or no stateDir (~/.spark-vllm)"
    path: str
    leaf_owned: bool  # the path itself must be the user's own (root's will not do)


STATE = (
    "the state directory",
    "hosts[].stateDir",
    "/srv/spark-vllm, or no stateDir (~/.spark-vllm)",
)
CACHE = ("model.cacheDir", "model.cacheDir", "~/.cache/huggingface or /srv/huggingface")


def problems(target: Target, entries: list[Entry], uid: int) -> list[str]:
    """What makes `target` unsafe for user `uid`, one line each with its fix. `entries` is
    `survey`'s: every one but the last is a directory on the way; the last is what the path
    itself is."""
    what, path = target.what, target.path
    elsewhere = (
        f"set {target.key} to a directory whose every parent only "
        f"{'root' if uid == 0 else f'root or {_owner(uid)}'} may write, e.g. {target.example}"
    )
    found = []
    *parents, last = entries
    links = [entry.path for entry in parents if entry.kind == "followed"]
    if links and target.leaf_owned:
        # A destroy empties only the directory itself (lib.sh `empty` refuses a path a link
        # leads elsewhere): refused now, not at the destroy.
        found.append(
            f"{what} {path} leads through a symbolic link ({', '.join(links)}); a destroy "
            f"empties only a path without links; fix: set {target.key} to the path "
            f"`realpath` gives for it"
        )
    for entry in parents:
        if entry.kind == "followed":
            continue  # the directory holding it is checked, and where it leads
        if entry.uid not in (0, uid):
            why = "belongs to another user"
        elif _writable_by_others(entry):
            why = "may be written by other users"
        else:
            continue
        # A sticky tree (/tmp's 1777) is shared scratch space by design: no chmod mends it.
        mend = (
            ""
            if entry.mode & stat.S_ISVTX
            else f", or as root: chown root {entry.path} && chmod go-w {entry.path}"
        )
        found.append(
            f"{entry.path}, a parent of {what} {path}, {why} ({_shown(entry)}): whoever may "
            f"write it can put a directory of theirs, or a link, in place of {path}; fix: "
            f"{elsewhere}{mend}"
        )
    if last.kind == "link":
        found.append(
            f"{what} {path} is a symbolic link ({_shown(last)}): spark-vllm writes there and a "
            f"destroy deletes there, and a link may lead anywhere; fix: remove the link, and "
            f"set {target.key} to the real directory if that is where it should be"
        )
    elif last.kind == "other":
        found.append(f"{what} {last.path} is not a directory ({_shown(last)}); fix: {elsewhere}")
    elif last.kind == "dir":
        owners = (uid,) if target.leaf_owned else (0, uid)
        if last.uid not in owners:
            found.append(
                f"{what} {path} belongs to another user ({_shown(last)}): it may hold what they "
                f"put there; fix: {elsewhere}; if the directory is yours, as root: "
                f"chown -R {uid} {path} && chmod go-w {path}"
            )
        elif _writable_by_others(last):
            found.append(
                f"{what} {path} may be written by other users ({_shown(last)}); fix: "
                f"chmod go-w {path}"
            )
    return found


def main(argv: list[str]) -> int:
    state_leaf, cache_dir = argv
    uid = os.getuid()
    state = Target(*STATE, path=state_leaf, leaf_owned=True)
    cache = Target(*CACHE, path=cache_dir, leaf_owned=False)
    found = problems(state, survey(state_leaf, follow_last=False), uid)
    found += problems(cache, survey(cache_dir, follow_last=True), uid)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
