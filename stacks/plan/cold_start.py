"""A server's cold start, stage by stage: the image copy to each of its workers, the weights'
fetch on the head and copy to each worker, the memory check, then from its container's start
the port open, /health answering and the first completion. Each step reports its own time on
its stdout (the copies' `-sent` JSON `seconds`, `spark-vllm-seconds S` of the fetch and the
memory check: lib.sh step_seconds; the readiness wait's `spark-vllm-start {json}`); a step that
did not run in this `up` keeps what it measured when it last did. Nobody publishes these
figures from deploy to first token for two Sparks (../shared/ANCHORS.md, 2026-12-04 survey):
the `models` output carries them, and `up` prints them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stacks.plan import names
from stacks.plan.server_plan import ServerPlan

SECONDS_PREFIX = "spark-vllm-seconds "
START_PREFIX = "spark-vllm-start "
SENT_PREFIX = {"image": "spark-vllm-image-sent ", "weights": "spark-vllm-weights-sent "}
# The readiness wait's figures, from the container's start, in the order they happen.
START_STAGES = ("containerStartSeconds", "portOpenSeconds", "healthSeconds", "firstTokenSeconds")


@dataclass(frozen=True)
class ColdStartSteps:
    """The steps whose stdout hold a server's cold-start figures, by resource name."""

    image_copies: dict[str, str]  # by worker (none when the server runs on the head alone)
    weights_fetch: str
    weights_copies: dict[str, str]  # by worker
    memory_check: str
    readiness: str

    def every(self) -> list[str]:
        return [
            *self.image_copies.values(),
            self.weights_fetch,
            *self.weights_copies.values(),
            self.memory_check,
            self.readiness,
        ]


def cold_start_steps(plan: ServerPlan, planned: Mapping[str, object]) -> ColdStartSteps:
    """`planned`: the graph's resources by name (a worker that already held the image has no
    copy of its own in a relay chain's place: only what the graph planned counts)."""
    weights = names.weights_of(plan.slot)
    image = plan.image_stream.component
    images = {w.name: names.image_sync_of(image, w.name) for w in plan.workers}
    copies = {w.name: names.weights_copy_of(weights, w.name) for w in plan.workers}
    return ColdStartSteps(
        image_copies={w: step for w, step in images.items() if step in planned},
        weights_fetch=names.fetch_of(weights),
        weights_copies={w: step for w, step in copies.items() if step in planned},
        memory_check=names.check_of(names.memory_of(plan.slot)),
        readiness=names.ready_of(names.vllm_of(plan.slot)),
    )


def _last_line(stdout: str, prefix: str) -> str | None:
    lines = [line for line in stdout.splitlines() if line.startswith(prefix)]
    return lines[-1].removeprefix(prefix) if lines else None


def step_seconds(stdout: str) -> float | None:
    """lib.sh step_seconds' figure (None from a step that printed none: an older release's)."""
    found = _last_line(stdout, SECONDS_PREFIX)
    return float(found) if found is not None else None


def copy_seconds(stdout: str, kind: str) -> float | None:
    """A copy's `seconds`, from its `spark-vllm-<kind>-sent {json}` line."""
    found = _last_line(stdout, SENT_PREFIX[kind])
    seconds = json.loads(found).get("seconds") if found is not None else None
    return float(seconds) if seconds is not None else None


def start_figures(readiness: str) -> dict[str, float | None]:
    """The readiness wait's figures from the container's start; all None when it did not
    measure them (the server was ready at its first probe: not a cold start)."""
    line = _last_line(readiness, START_PREFIX)
    figures = json.loads(line) if line is not None else {}
    if not figures.get("measured"):
        return dict.fromkeys(START_STAGES)
    found: dict[str, float | None] = {stage: figures.get(stage) for stage in START_STAGES}
    port, health = found["portOpenSeconds"], found["healthSeconds"]
    if port is not None and health is not None:
        # The port is watched four times a second, /health once per probe: a port seen open
        # a moment after /health answered was open by then.
        found["portOpenSeconds"] = min(port, health)
    return found


def cold_start(steps: ColdStartSteps, stdout: Mapping[str, str]) -> dict[str, Any]:
    """The `coldStart` entry of a server's `models` output, from its steps' stdout."""
    return {
        "imageCopySeconds": {
            w: copy_seconds(stdout[step], "image") for w, step in steps.image_copies.items()
        },
        "weightsFetchSeconds": step_seconds(stdout[steps.weights_fetch]),
        "weightsCopySeconds": {
            w: copy_seconds(stdout[step], "weights") for w, step in steps.weights_copies.items()
        },
        "memoryCheckSeconds": step_seconds(stdout[steps.memory_check]),
        **start_figures(stdout[steps.readiness]),
    }


def cold_start_table(served_name: str, figures: Mapping[str, Any]) -> str:
    """What `up` prints: one line per stage, slowest worker's copy shown."""

    def seconds(value: Any) -> str:
        if isinstance(value, dict):
            known = [v for v in value.values() if v is not None]
            return f"{max(known):.1f} s" if known else ("none" if not value else "-")
        return f"{value:.1f} s" if value is not None else "-"

    rows = [
        ("image copy (slowest worker)", figures["imageCopySeconds"]),
        ("weights fetch (head)", figures["weightsFetchSeconds"]),
        ("weights copy (slowest worker)", figures["weightsCopySeconds"]),
        ("memory check", figures["memoryCheckSeconds"]),
        ("container start", figures["containerStartSeconds"]),
        ("port open, from the start", figures["portOpenSeconds"]),
        ("/health, from the start", figures["healthSeconds"]),
        ("first token, from the start", figures["firstTokenSeconds"]),
    ]
    return "\n".join(
        [f"cold start of {served_name}:", *(f"  {label}: {seconds(v)}" for label, v in rows)]
    )
