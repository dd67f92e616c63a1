"""copy_image.py, the image copy: its probe read from the worker script's real answer, and
each chain member's fact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.program.scripting import SCRIPTS, load

FIXTURES = Path(__file__).parent / "fixtures" / "inspect"
load("copy_plan")
layers = load("image_layers")
image = load("copy_image")


# --- the worker's image facts --------------------------------------------------------------------

FAKE_DOCKER = """#!/usr/bin/env bash
case "$*" in
  "image inspect spark-vllm.invalid/image:sha256-abc") cat "$INSPECTED" ;;
  "image inspect --format {{json .RootFS.Layers}} "*)
    printf '%s\\n' '["sha256:aa","sha256:bb"]' '["sha256:cc"]' ;;
  "image inspect "*) echo '[]'; echo "Error: No such image: $3" >&2; exit 1 ;;
  "image ls -q --no-trunc") printf 'sha256:1\\nsha256:2\\nsha256:1\\n' ;;
  *) echo "fake docker: $*" >&2; exit 2 ;;
esac
"""


PINNED = "spark-vllm.invalid/image:sha256-abc"


def probe(tmp_path: Path, inspected: str, staged: dict[str, int]) -> Any:
    """image-probe.sh run for real beside a fake Docker; its answer parsed by the image."""
    bin_dir = tmp_path / "leaf" / "bin"
    shutil.copytree(SCRIPTS, bin_dir)
    stage = tmp_path / "leaf" / "image-stage" / "abc"
    for name, size in staged.items():
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_bytes(b"x" * size)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "docker").write_text(FAKE_DOCKER)
    (fake / "docker").chmod(0o755)
    (tmp_path / "inspected.json").write_text(inspected)
    done = subprocess.run(
        ["bash", str(bin_dir / "image-probe.sh"), PINNED, "abc", "5"],
        capture_output=True, text=True, timeout=30, check=True,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
             "INSPECTED": str(tmp_path / "inspected.json")},
    )  # fmt: skip
    return image.parse_image_probe(done.stdout)


def test_the_probe_reads_what_a_worker_holds(tmp_path: Path) -> None:
    inspected = (FIXTURES / "docker-26-containerd.json").read_text()
    facts = probe(tmp_path, inspected, {"blobs/sha256/x": 7, "empty": 0})
    assert facts.reachable
    assert facts.identity == layers.identity(json.loads(inspected)[0])
    assert facts.staged == {"blobs/sha256/x": 7}
    assert facts.zstd == (shutil.which("zstd") is not None)
    assert facts.images == [["sha256:aa", "sha256:bb"], ["sha256:cc"]]


def test_a_worker_without_the_image_has_no_identity_and_a_cut_answer_is_unreachable(
    tmp_path: Path,
) -> None:
    facts = probe(tmp_path, "", {})
    assert facts.reachable and facts.identity == "" and facts.staged == {}
    cut = "== pinned\n[]\n== staged\n"
    assert not image.parse_image_probe(cut).reachable
    assert not image.parse_image_probe("").reachable


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({}, "unreachable"),
        ({"reachable": True, "identity": "content:1"}, "has"),
        ({"reachable": True, "identity": "content:2", "staged": {"a": 1}}, "staged"),
        ({"reachable": True, "staged": {"a": 0}, "images": [["sha256:aa"]], "zstd": True},
         "1 zstd"),
        ({"reachable": True, "images": [["sha256:bb"]]}, "0 plain"),
    ],
    ids=["unreachable", "has", "staged", "holds-the-base", "holds-nothing"],
)  # fmt: skip
def test_a_chain_members_fact(facts: dict[str, object], expected: str) -> None:
    found = image.ImageFacts(**facts)
    assert image.image_chain_fact(found, "content:1", ["sha256:aa", "sha256:cc"]) == expected
