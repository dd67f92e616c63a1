"""The cold-start figures (stacks/plan/cold_start.py): each step's own time parsed from its
stdout, the `models` output's `coldStart` per server, and the table `up` prints. The scripts'
lines are the ones the harness answers with (tests/program/harness.py), as the real ones print
them; the lab prints measured ones (tests/lab/test_e2e.py, test_real_vllm.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks.plan import cold_start as cs
from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import evaluate


def test_each_steps_time_is_read_from_its_own_line() -> None:
    assert cs.step_seconds("note\nspark-vllm-seconds 12.5\nabc 3 1048\n") == 12.5
    assert cs.step_seconds("abc 3 1048\n") is None  # an older release's step printed none
    sent = {"bytes": 10, "relayed": 0, "seconds": 61.2}
    assert cs.copy_seconds(f"spark-vllm-image-sent {json.dumps(sent)}\n", "image") == 61.2
    assert cs.copy_seconds('spark-vllm-weights-sent {"bytes":1}\n', "weights") is None


@pytest.mark.parametrize(
    ("line", "first_token"),
    [
        ('spark-vllm-start {"measured":true,"containerStartSeconds":0.4,"portOpenSeconds":31.0,'
         '"healthSeconds":33.1,"firstTokenSeconds":35.2}', 35.2),
        # Ready at the first probe: a wait run again on a server that serves, no cold start.
        ('spark-vllm-start {"measured":false}', None),
        ("", None),  # a readiness of an older release
    ],
)  # fmt: skip
def test_the_start_is_read_from_the_readiness_wait(line: str, first_token: float | None) -> None:
    figures = cs.start_figures(f"vllm: ready after 42s\n{line}\n")
    assert figures["firstTokenSeconds"] == first_token
    assert list(figures) == list(cs.START_STAGES)


def test_every_server_reports_its_cold_start(make_config: ConfigFactory) -> None:
    """Two hosts, one model: its image and weights copies to the worker, the fetch, the memory
    check, and the start from the container's, as each step printed them."""
    ev = evaluate(make_config(hosts=2, executor=None), SECRETS)
    (model,) = ev.outputs["models"]
    assert model["coldStart"] == {
        "imageCopySeconds": {"spark2": 61.2},
        "weightsFetchSeconds": 12.5,
        "weightsCopySeconds": {"spark2": 8.4},
        "memoryCheckSeconds": 3.0,
        "containerStartSeconds": 0.4,
        "portOpenSeconds": 31.0,
        "healthSeconds": 33.1,
        "firstTokenSeconds": 35.2,
    }


def test_a_server_on_the_head_alone_copies_nothing() -> None:
    figures: dict[str, Any] = {
        "imageCopySeconds": {},
        "weightsFetchSeconds": 12.5,
        "weightsCopySeconds": {},
        "memoryCheckSeconds": None,
        **dict.fromkeys(cs.START_STAGES),
    }
    table = cs.cold_start_table("qwen", figures)
    assert table.splitlines() == [
        "cold start of qwen:",
        "  image copy (slowest worker): none",
        "  weights fetch (head): 12.5 s",
        "  weights copy (slowest worker): none",
        "  memory check: -",
        "  container start: -",
        "  port open, from the start: -",
        "  /health, from the start: -",
        "  first token, from the start: -",
    ]


def test_the_table_shows_the_slowest_worker() -> None:
    figures: dict[str, Any] = {
        "imageCopySeconds": {"spark2": 61.2, "spark3": 70.0},
        "weightsFetchSeconds": 1.0,
        "weightsCopySeconds": {"spark2": None},
        "memoryCheckSeconds": 3.0,
        "containerStartSeconds": 0.4,
        "portOpenSeconds": None,
        "healthSeconds": 33.1,
        "firstTokenSeconds": 35.2,
    }
    lines = cs.cold_start_table("m", figures).splitlines()
    assert lines[1] == "  image copy (slowest worker): 70.0 s"
    assert lines[3] == "  weights copy (slowest worker): -"
    assert lines[-1] == "  first token, from the start: 35.2 s"


def test_a_port_seen_open_after_health_answered_was_open_by_then() -> None:
    line = ('spark-vllm-start {"measured":true,"containerStartSeconds":0.2,"portOpenSeconds":8.2,'
            '"healthSeconds":8.0,"firstTokenSeconds":8.1}')  # fmt: skip
    assert cs.start_figures(line)["portOpenSeconds"] == 8.0
