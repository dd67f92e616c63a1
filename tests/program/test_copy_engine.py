"""copy_engine.py, the copy steps' entry point: its command line and how it fails."""

from __future__ import annotations

import pytest

from tests.program.scripting import load

load("copy_plan")
load("image_layers")
engine = load("copy_engine")


def test_a_failure_is_one_message_naming_the_host_and_the_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert engine.main(["weights", "--host", "spark1", "--worker", "spark2"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("spark-vllm: spark1: weights-sync: missing --target"), said
    assert "Traceback" not in said
