"""image_stage.py: an image copy that a cut does not start again from nothing."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.program.scripting import load

copy_plan = load("copy_plan")
SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "image_stage.py"


def run(*args: str, stdin: bytes, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], input=stdin, capture_output=True, check=check
    )


def saved_stream() -> bytes:
    """A `docker save`-shaped stream: layer files (larger than the 16 KiB tarfile reads at a
    time, so a cut one leaves a part), the config, manifest.json last."""
    layers = {"aaa/layer.tar": b"a" * 100_000, "bbb/layer.tar": b"b" * 60_000}
    files = {
        **layers,
        "config.json": b"{}",
        "manifest.json": json.dumps([{"Config": "config.json", "Layers": list(layers)}]).encode(),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def members(stream: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def emptied(stream: bytes, names: set[str]) -> bytes:
    """The stream with `names` as empty files, as the head's filter sends staged members."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(stream)) as saved,
        tarfile.open(fileobj=out, mode="w") as thin,
    ):
        for member in saved.getmembers():
            data = saved.extractfile(member)
            if member.name in names:
                member.size, data = 0, io.BytesIO(b"")
            thin.addfile(member, data)
    return out.getvalue()


def test_a_cut_stream_leaves_what_arrived_staged_and_the_retry_fills_in_the_rest(
    tmp_path: Path,
) -> None:
    stream = saved_stream()
    whole = members(stream)
    stage = tmp_path / "image-stage" / "abc"
    (tmp_path / "image-stage" / "older-image").mkdir(parents=True)
    # The cut: the stream ends in the middle of the second layer.
    cut_at = stream.index(b"b" * 60_000) + 40_000
    done = run("receive", str(stage), stdin=stream[:cut_at], check=False)
    assert done.returncode != 0
    assert not (tmp_path / "image-stage" / "older-image").exists()  # one image staged at a time
    assert (stage / "aaa/layer.tar").read_bytes() == whole["aaa/layer.tar"]
    part = (stage / "bbb/layer.tar").read_bytes()
    assert 0 < len(part) < 60_000 and whole["bbb/layer.tar"].startswith(part)
    # What the head makes of it, against the index of its saved stream.
    index = json.loads(
        subprocess.run(
            [sys.executable, str(SCRIPT.with_name("image_layers.py")), "index"],
            input=stream, capture_output=True, check=True,
        ).stdout
    )  # fmt: skip
    staged = {str(p.relative_to(stage)): p.stat().st_size for p in stage.rglob("*") if p.is_file()}
    copy = copy_plan.image_copy(3, 0, index, staged)
    assert (copy.staged_whole, copy.staged_parts) == (
        ["aaa/layer.tar"],
        {"bbb/layer.tar": (len(part), 60000)},
    )
    # The part completed from the head's stream, from where it stopped.
    rest = run("tail", "bbb/layer.tar", str(len(part)), stdin=stream).stdout
    assert part + rest == whole["bbb/layer.tar"]
    with (stage / "bbb/layer.tar").open("ab") as handle:
        handle.write(rest)
    # The retry: both staged members go empty; the worker's docker load gets them whole.
    loaded = run("receive", str(stage), stdin=emptied(stream, {"aaa/layer.tar", "bbb/layer.tar"}))
    assert members(loaded.stdout) == whole


def test_a_member_name_that_leaves_the_stage_is_refused(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    done = run("receive", str(tmp_path / "stage" / "abc"), stdin=out.getvalue(), check=False)
    assert done.returncode != 0 and b"refusing member name" in done.stderr
    assert not (tmp_path / "stage" / "escape").exists()
