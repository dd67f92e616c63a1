"""Each node's image history (components/scripts/image_retain.py): a bounded number of
previous images kept for a rollback that copies nothing, older ones' pinned names removed, and
never a name the history did not record or one a container uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.plan.image import parse_retained, pinned_image

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "image_retain.py"
sys.path.insert(0, str(SCRIPT.parent))
import image_retain  # noqa: E402

A, B, C, D = (pinned_image(f"sha256:{c * 64}") for c in "abcd")


@pytest.mark.parametrize(
    ("history", "current", "keep_previous", "kept", "removed"),
    [
        ([], A, 1, [A], []),  # the first image
        ([A], A, 1, [A], []),  # the same again: nothing changes
        ([A], B, 1, [A, B], []),  # an upgrade keeps the previous one
        ([A, B], C, 1, [B, C], [A]),  # ...and only one
        ([A, B], A, 1, [B, A], []),  # a rollback to the previous: it is the newest again
        ([A, B, C], D, 2, [B, C, D], [A]),
        ([A, B], C, 0, [C], [A, B]),
        ([A, B, A], C, 1, [A, C], [B]),  # each name once, where it was last deployed
    ],
)
def test_retention_keeps_the_current_and_the_newest_previous(
    history: list[str], current: str, keep_previous: int, kept: list[str], removed: list[str]
) -> None:
    assert image_retain.retention(history, current, keep_previous) == (kept, removed)


def fake_docker(tmp_path: Path, images: dict[str, str]) -> dict[str, str]:
    """A `docker` on PATH that knows `images` (name -> "free", "used": Docker refuses to remove
    it, or "shared": it has another name, so Docker would only untag it, while a container of
    another stack runs it) and logs its calls."""
    lines = ['case "$1 $2" in']
    lines.append('  "ps -aq") case "$4" in')
    lines += [f'    "ancestor={n}") echo c0ffee ;;' for n, s in images.items() if s == "shared"]
    lines.append("    *) : ;; esac ;;")
    lines.append('  "image inspect") case "$3" in')
    lines += [f'    "{name}") exit 0 ;;' for name in images]
    lines.append("    *) exit 1 ;; esac ;;")
    lines.append('  "image rm") echo "$@" >> "$LOG"; case "$4" in')
    lines += [f'    "{n}") exit {1 if s == "used" else 0} ;;' for n, s in images.items()]
    lines.append("    *) exit 1 ;; esac ;;")
    lines.append("esac")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\n" + "\n".join(lines) + "\n")
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(tmp_path / "log")}


def retain(tmp_path: Path, env: dict[str, str], pinned: str, keep: int) -> dict[str, list[str]]:
    done = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--host", "spark2", "--history", str(tmp_path / "h")),
            *("--pinned", pinned, "--keep-previous", str(keep)),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert parse_retained(done.stdout) == json.loads(done.stdout.split(" ", 1)[1])["kept"]
    report: dict[str, list[str]] = json.loads(done.stdout.split(" ", 1)[1])
    return report


def test_older_images_lose_their_name_one_in_use_is_kept_for_the_next_run(
    tmp_path: Path,
) -> None:
    env = fake_docker(tmp_path, {A: "used", B: "free", C: "free"})
    (tmp_path / "h").write_text(f"{A}\n{B}\nsomeone-else/image:1\n")
    report = retain(tmp_path, env, C, 0)
    assert report == {"kept": [C], "removed": [B], "inUse": [A]}
    # Only our pinned names, each with --no-prune; a foreign line in the file is dropped.
    assert (tmp_path / "log").read_text().splitlines() == [
        f"image rm --no-prune {A}",
        f"image rm --no-prune {B}",
    ]
    assert (tmp_path / "h").read_text().splitlines() == [A, C]  # A is tried again next time


def test_a_name_another_stacks_container_runs_is_kept(tmp_path: Path) -> None:
    """Every stack on a host shares the pinned name (by content): an image that has another
    name too would only be untagged by Docker, under another stack's running container."""
    env = fake_docker(tmp_path, {A: "shared", C: "free"})
    (tmp_path / "h").write_text(f"{A}\n")
    assert retain(tmp_path, env, C, 0) == {"kept": [C], "removed": [], "inUse": [A]}
    assert not (tmp_path / "log").exists()  # never asked Docker to remove it


def test_a_name_already_gone_is_not_removed_again(tmp_path: Path) -> None:
    env = fake_docker(tmp_path, {B: "free"})
    (tmp_path / "h").write_text(f"{A}\n")
    assert retain(tmp_path, env, B, 0) == {"kept": [B], "removed": [A], "inUse": []}
    assert not (tmp_path / "log").exists()


def test_a_name_outside_the_pinned_repository_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--host", "h", "--history", str(tmp_path / "h")),
            *("--pinned", "vllm/vllm-openai:latest", "--keep-previous", "1"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "bad arguments" in done.stderr


def test_an_entrys_own_image_keeps_a_history_of_its_own_repository(tmp_path: Path) -> None:
    """An entry's own image (`spark-vllm.invalid/image-i<hash>:...`): its history removes only its
    own repository's names, never image.ref's, even when a line of the other is there."""
    own_a, own_b = (name.replace("/image:", "/image-i62e988a9:") for name in (A, B))
    env = fake_docker(tmp_path, {A: "free", own_a: "free", own_b: "free"})
    (tmp_path / "h").write_text(f"{A}\n{own_a}\n")
    assert retain(tmp_path, env, own_b, 0) == {"kept": [own_b], "removed": [own_a], "inUse": []}
    assert (tmp_path / "log").read_text().splitlines() == [f"image rm --no-prune {own_a}"]
    assert image_retain.repository_of("spark-vllm.invalid/image-ix:1") is None
