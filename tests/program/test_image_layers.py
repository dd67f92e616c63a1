"""image_layers.py: which leading layers a worker holds, and a saved stream without them."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "components" / "scripts" / "image_layers.py"
sys.path.insert(0, str(SCRIPT.parent))
import image_layers  # noqa: E402


def digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


BASE, MIDDLE, TOP, OTHER = (digest(n) for n in ("base", "middle", "top", "other"))


def test_chain_ids_follow_the_image_spec() -> None:
    chains = image_layers.chain_ids([BASE, MIDDLE])
    assert chains[0] == BASE
    assert chains[1] == "sha256:" + hashlib.sha256(f"{BASE} {MIDDLE}".encode()).hexdigest()


def test_only_a_leading_run_of_the_same_chain_counts_as_held() -> None:
    worker = [[BASE, MIDDLE, OTHER]]
    assert image_layers.held_count([BASE, MIDDLE, TOP], worker) == 2
    # The same layer on another base is another chain: it is sent.
    assert image_layers.held_count([OTHER, MIDDLE], [[BASE, MIDDLE]]) == 0
    assert image_layers.held_count([BASE], []) == 0
    assert image_layers.held_count([BASE, MIDDLE], [[BASE], [BASE, MIDDLE, TOP]]) == 2


def saved_stream() -> bytes:
    """A `docker save`-shaped stream: layer files first, manifest.json last."""
    members = {
        "aaa/layer.tar": b"a" * 5000,
        "bbb/layer.tar": b"b" * 3000,
        "ccc/layer.tar": b"c" * 1000,
        "config.json": b"{}",
        "manifest.json": json.dumps(
            [
                {
                    "Config": "config.json",
                    "Layers": ["aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar"],
                }
            ]
        ).encode(),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def run(*args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], input=stdin, capture_output=True, check=True
    )


def test_the_index_names_each_layers_member_and_the_filter_empties_the_held_ones(
    tmp_path: Path,
) -> None:
    stream = saved_stream()
    index = json.loads(run("index", stdin=stream).stdout)
    assert index["layers"] == ["aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar"]
    assert index["sizes"]["aaa/layer.tar"] == 5000
    (tmp_path / "index.json").write_text(json.dumps(index))
    left = int(run("to-send", str(tmp_path / "index.json"), "2", stdin=b"").stdout)
    assert left == sum(index["sizes"].values()) - 8000
    done = run("filter", str(tmp_path / "index.json"), "2", stdin=stream)
    assert b"8000 bytes of held layers left out" in done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as thin:
        sizes = {m.name: m.size for m in thin.getmembers()}
        assert sizes == {"aaa/layer.tar": 0, "bbb/layer.tar": 0, "ccc/layer.tar": 1000,
                         "config.json": 2, "manifest.json": sizes["manifest.json"]}  # fmt: skip
        top = thin.extractfile("ccc/layer.tar")
        assert top is not None and top.read() == b"c" * 1000
    assert len(done.stdout) < len(stream) - 7000


def test_held_reads_the_workers_inspect_lines() -> None:
    lines = f"{json.dumps([BASE, MIDDLE])}\n{json.dumps([OTHER])}\n".encode()
    done = run("held", json.dumps([BASE, MIDDLE, TOP]), stdin=lines)
    assert done.stdout.decode().strip() == "2"
