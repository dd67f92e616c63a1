"""The committed stacks' resource graphs, pinned: URN, type, parent, dependencies, options and
inputs of every resource of the dev and lab stacks, as the program registers them. A refactor
must leave them as they are (an existing stack would otherwise see an update or a replacement);
a deliberate change regenerates them with `SPARK_VLLM_UPDATE_GOLDEN=1 uv run pytest
tests/program/test_graph_stability.py` and shows up, reviewable, in the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.program.goldens import GOLDEN, graph


@pytest.mark.parametrize("stack", ["dev", "lab"])
def test_the_committed_stacks_register_the_same_graph(
    stack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = graph(stack, tmp_path, monkeypatch)
    golden = GOLDEN / f"{stack}.json"
    if os.environ.get("SPARK_VLLM_UPDATE_GOLDEN") == "1":
        golden.write_text(now)
    assert golden.exists(), f"{golden} is missing: generate it (see this module's docstring)"
    assert now == golden.read_text(), (
        f"the {stack} stack's resource graph changed; if deliberate, regenerate {golden.name}"
    )
