"""The weights copy's content check (components/scripts/blob_check.py, copy_weights.py
check_content): an HF blob's name is its content's hash, so a blob that arrived with the right
size and other bytes is found, removed, and named, where a size check passes it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.program.scripting import SCRIPTS, load

CHECK = load("blob_check")
COPY = load("copy_weights")


def lfs_blob(blobs: Path, content: bytes) -> str:
    name = hashlib.sha256(content).hexdigest()
    (blobs / name).write_bytes(content)
    return name


def git_blob(blobs: Path, content: bytes) -> str:
    name = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    (blobs / name).write_bytes(content)
    return name


def check(blobs: Path, names: list[str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["python3", str(SCRIPTS / "blob_check.py"), str(blobs), *flags],
        input="".join(f"{n}\n" for n in names), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_blobs_whose_bytes_match_their_names_pass(tmp_path: Path) -> None:
    names = [lfs_blob(tmp_path, os.urandom(3 * CHECK.CHUNK + 5)), git_blob(tmp_path, b"{}\n")]
    done = check(tmp_path, names, "--remove")
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    assert all((tmp_path / name).exists() for name in names)


def test_a_blob_with_the_right_size_and_other_bytes_is_named_and_removed(tmp_path: Path) -> None:
    good = lfs_blob(tmp_path, os.urandom(1 << 20))
    bad, small = lfs_blob(tmp_path, os.urandom(1 << 20)), git_blob(tmp_path, b'{"a": 1}\n')
    for name in (bad, small):
        data = bytearray((tmp_path / name).read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit: the size is the same
        (tmp_path / name).write_bytes(bytes(data))
    kept = check(tmp_path, [good, bad, small])
    assert (kept.returncode, kept.stdout.split()) == (0, [bad, small])
    assert (tmp_path / bad).exists(), "without --remove nothing is deleted"
    removed = check(tmp_path, [good, bad, small], "--remove")
    assert removed.stdout.split() == [bad, small]
    assert sorted(p.name for p in tmp_path.iterdir()) == [good]


@pytest.mark.parametrize("names", [["../x"], ["a/b"], [".."]])
def test_a_name_that_is_not_a_blobs_is_refused(tmp_path: Path, names: list[str]) -> None:
    assert check(tmp_path, names, "--remove").returncode == 2


def test_a_missing_blob_is_an_error_not_a_pass(tmp_path: Path) -> None:
    done = check(tmp_path, ["a" * 64])
    assert done.returncode == 2 and "No such file" in done.stderr


class LocalFabric:
    """The worker is this machine: each call runs under bash here."""

    key = ""

    def ask(self, destination: str, remote: str, stdin: str = "", seconds: int = 60) -> tuple:
        done = subprocess.run(["bash", "-c", remote], input=stdin, capture_output=True,
                              text=True, timeout=seconds)  # fmt: skip
        return done.returncode, done.stdout + done.stderr


def weights_copy(cache: Path) -> Any:
    flags = {"host": "spark1", "worker": "spark2", "target": "ssh://u@10.0.0.2:22",
             "worker_bin": str(SCRIPTS), "timeout_minutes": "5", "cache_dir": str(cache),
             "model": "org/model", "manifest": f"{'c' * 40} 1 10"}  # fmt: skip
    copy = COPY.WeightsCopy(flags)
    copy.fabric = LocalFabric()
    return copy


def test_the_copy_fails_naming_the_corrupt_blob_and_leaves_it_to_the_next_run(
    tmp_path: Path,
) -> None:
    blobs = tmp_path / "hub" / "models--org--model" / "blobs"
    blobs.mkdir(parents=True)
    good = lfs_blob(blobs, os.urandom(4096))
    bad = lfs_blob(blobs, os.urandom(4096))
    (blobs / bad).write_bytes(os.urandom(4096))
    copy = weights_copy(tmp_path)
    copy.check_content("spark2", "ssh://u@10.0.0.2:22", str(SCRIPTS), [good])  # passes
    with pytest.raises(Exception) as caught:  # hostlib.StepFailed, as the copy imported it
        copy.check_content("spark2", "ssh://u@10.0.0.2:22", str(SCRIPTS), [good, bad])
    assert str(caught.value).startswith(
        f"1 blob(s) of org/model@{'c' * 40} arrived on spark2 with other bytes than their hash "
        f"names ({bad}); removed there, the next run sends them again"
    ), caught.value
    assert type(caught.value).__name__ == "StepFailed"
    assert not (blobs / bad).exists() and (blobs / good).exists()
