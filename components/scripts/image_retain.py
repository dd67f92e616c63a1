"""On any node, once the serving image is there under its pinned name: record it in the node's
image history, and take the pinned name off the images older than `--keep-previous` previous
ones, so the disk holds a bounded number of images and a rollback to a kept one copies nothing.

    python3 image_retain.py --host H --history FILE --pinned NAME --keep-previous N

Only names of spark-vllm's own pinned repository that this history recorded are ever removed
(the pinned name's: image.ref's `spark-vllm.invalid/image`, an entry's own image's
`spark-vllm.invalid/image-i<hash>`, each with a history of its own),
and only with `docker image rm --no-prune`: Docker refuses while a container (running or not)
uses the image, which is then kept and tried again on the next run; an image that still has
another name (the head's pulled ref) keeps its data. Prints one line: `spark-vllm-images` and
JSON: `kept` (newest first), `removed`, `inUse`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence

from hostlib import require, run_step

# stacks/plan/image.py pinned_image: PINNED_REPOSITORY, or an image stream's own beside it.
PINNED_REPOSITORY = re.compile(r"spark-vllm\.invalid/image(-i[0-9a-f]{8})?:")
PREFIX = "spark-vllm-images "
RM_SECONDS = 240


def retention(
    history: Sequence[str], current: str, keep_previous: int
) -> tuple[list[str], list[str]]:
    """The history with `current` as its newest entry (oldest first, each name once), and the
    names to remove: all but `current` and the `keep_previous` newest before it."""
    # Each name once, where it was last deployed.
    latest_first = dict.fromkeys(reversed([*history, current]))
    ordered = list(reversed(latest_first))
    keep = ordered[-(keep_previous + 1) :]
    return keep, [name for name in ordered if name not in keep]


def repository_of(name: str) -> str | None:
    """`spark-vllm.invalid/image:` (or `...image-i1a2b3c4d:`) for our pinned names, else None."""
    found = PINNED_REPOSITORY.match(name)
    return found.group(0) if found else None


def read_history(path: str, repository: str) -> list[str]:
    """The recorded names of `repository` alone (no other name is ever removed)."""
    try:
        with open(path, encoding="utf-8") as lines:
            names = [line.strip() for line in lines]
    except FileNotFoundError:
        return []
    return [name for name in names if name.startswith(repository)]


def write_history(path: str, names: Sequence[str]) -> None:
    """Written whole to a temporary file, then renamed: a cut run never leaves half a file."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as out:
        out.writelines(f"{name}\n" for name in names)
    os.replace(partial, path)


def remove(name: str) -> str:
    """`removed`, `gone` (no image has the name any more) or `in use`: a container uses the
    image. Docker itself refuses only to remove an image's last name while a container uses
    it; an image with another name (the head's pulled ref) would lose the pinned one, which
    every stack on the host shares, under another stack's containers."""
    present = subprocess.run(
        ["docker", "image", "inspect", name], capture_output=True, timeout=60, check=False
    )
    if present.returncode != 0:
        return "gone"
    users = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"ancestor={name}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if users.returncode != 0 or users.stdout.strip():
        return "in use"
    result = subprocess.run(
        ["docker", "image", "rm", "--no-prune", name],
        capture_output=True,
        text=True,
        timeout=RM_SECONDS,
        check=False,
    )
    return "removed" if result.returncode == 0 else "in use"


def retain(flags: dict[str, str]) -> int:
    require(flags, "host", "history", "pinned", "keep-previous")
    history_file, pinned = flags["history"], flags["pinned"]
    keep_previous = int(flags["keep_previous"])
    repository = repository_of(pinned)
    if repository is None or keep_previous < 0:
        said = f"spark-vllm: {flags['host']}: image retain: bad arguments {sys.argv[1:]}"
        print(said, file=sys.stderr)
        return 2
    history = read_history(history_file, repository)
    keep, doomed = retention(history, pinned, keep_previous)
    outcome = {name: remove(name) for name in doomed}
    in_use = [name for name, result in outcome.items() if result == "in use"]
    # An image Docker would not remove stays in the history: the next run tries again.
    write_history(history_file, [*in_use, *keep])
    report = {
        "kept": list(reversed(keep)),
        "removed": [name for name, result in outcome.items() if result != "in use"],
        "inUse": in_use,
    }
    print(PREFIX + json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(run_step("image-retain", sys.argv[1:], retain))
