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


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "inspect"
# `docker image inspect` of one image (the lab image with one committed layer) as each store
# shows it, captured in the lab: Debian 12's Docker 20.10, and Debian 13's Docker 26.1 with the
# classic store and with the containerd image store (where the ID is a manifest's digest).
STORES = ("docker-20.10", "docker-26-overlay2", "docker-26-containerd")


def inspected(store: str) -> dict[str, object]:
    entries = json.loads((FIXTURES / f"{store}.json").read_text())
    assert len(entries) == 1
    return entries[0]  # type: ignore[no-any-return]


def test_the_same_image_has_one_identity_on_every_store_though_its_ids_differ() -> None:
    ids = {store: inspected(store)["Id"] for store in STORES}
    assert ids["docker-20.10"] == ids["docker-26-overlay2"] != ids["docker-26-containerd"]
    identities = {image_layers.identity(inspected(store)) for store in STORES}
    assert len(identities) == 1
    assert identities.pop().startswith("content:")


def test_an_image_without_a_creation_time_has_one_identity_too() -> None:
    """A config without `created` (the benchmark's images): 20.10 shows Go's zero time, the
    containerd store leaves it out."""
    stores = ("no-created-docker-20.10", "no-created-docker-26-containerd")
    created = [inspected(store).get("Created") for store in stores]
    assert created == ["0001-01-01T00:00:00Z", None]
    assert len({image_layers.identity(inspected(store)) for store in stores}) == 1


def test_anything_in_the_config_changes_the_identity() -> None:
    base = inspected("docker-26-containerd")
    config = base["Config"]
    assert isinstance(config, dict)
    changed = [
        {**base, "Created": "2026-12-03T12:58:25.372444605Z"},
        {**base, "Architecture": "arm64"},
        {**base, "RootFS": {"Type": "layers", "Layers": [BASE]}},
        {**base, "Config": {**config, "Env": [*config["Env"], "EXTRA=1"]}},
        {**base, "Config": {**config, "Entrypoint": ["vllm"]}},
        {**base, "Config": {**config, "Labels": {}}},
    ]
    original = image_layers.identity(base)
    assert all(image_layers.identity(other) != original for other in changed)
    # Docker-only fields that the containerd store shows empty do not count; neither does how
    # a store shows "nothing" (null or empty).
    same = [
        {**base, "Config": {**config, "Hostname": "6d02aea3cabf", "AttachStdout": True}},
        {**base, "Config": {**config, "Volumes": {}, "OnBuild": []}},
        {**base, "Id": "sha256:" + "0" * 64, "RepoTags": ["other:tag"]},
    ]
    assert all(image_layers.identity(other) == original for other in same)


def test_identity_reads_inspect_output_and_prints_one_line_per_image() -> None:
    text = (FIXTURES / "docker-20.10.json").read_text()
    both = json.dumps(json.loads(text) * 2)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "identity"], input=both, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [image_layers.identity(inspected("docker-20.10"))] * 2
    # Nothing inspected (the worker lacks the name): nothing printed, no failure.
    empty = subprocess.run(
        [sys.executable, str(SCRIPT), "identity"], input="", capture_output=True, text=True
    )
    assert (empty.returncode, empty.stdout) == (0, "")
