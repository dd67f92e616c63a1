"""A deployed lab stack and its next `pulumi up`, observed (shared by the day-two tests): each
run is planned by the engine model, a client polls the endpoint through the bastion meanwhile,
and the plan, wall time and downtime go to the "day two" section of the test summary."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import Lab
from tests.lab.deploying import API_KEY, REPO, EndpointPoller, deploy, forward_through_bastion
from tests.lab.engine import NextUp, log_plan
from tests.lab.realmocks import RealMocks, StackOutputs
from tests.lab.timings import record_day_two


@dataclass
class Stack:
    lab: Lab
    state: RealMocks  # the run whose state the stack is now
    outputs: StackOutputs
    config: dict[str, Any]
    endpoint: str  # through an ssh tunnel via the bastion
    api_key: str = API_KEY
    project_dir: Path = REPO  # the spark-vllm release that deploys it


@contextlib.contextmanager
def deployed(lab: Lab, config: dict[str, Any]) -> Iterator[Stack]:
    """A first `up` of `config`, the tunnel to its endpoint, and a destroy at the end."""
    first = RealMocks()
    try:
        outputs = deploy(lab, first, config)
    except BaseException:
        first.teardown()
        raise
    tunnel, endpoint = forward_through_bastion(lab, outputs["endpointUrl"])
    stack = Stack(lab, first, outputs, config, endpoint)
    try:
        yield stack
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)
        stack.state.teardown()  # idempotent: empty after a destroy test ran


def next_up(
    stack: Stack,
    scenario: str,
    config: dict[str, Any],
    project_dir: Path | None = None,
    *,
    refresh: bool = False,
) -> NextUp:
    """One `pulumi up` (`--refresh`) on the deployed stack while a client polls the endpoint."""
    run = NextUp(stack.state, refresh=refresh)
    started = time.monotonic()
    new_key = config.get("spark-vllm:apiKey", stack.api_key)
    with EndpointPoller(stack.endpoint, stack.api_key, new_key) as poller:
        try:
            stack.outputs = deploy(stack.lab, run, config, project_dir or stack.project_dir)
        finally:
            stack.state = run  # a failed run's state is the stack too
        # The run returns once the new server answered a completion; let the poller see it.
        time.sleep(1)
    record_day_two(scenario, run.summary(), time.monotonic() - started, poller.downtime())
    log_plan(f"day two: {scenario}", run)
    stack.config = config
    return run
