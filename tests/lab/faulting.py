"""Faults tried against a lab: runs that must fail with one clear message, then a clean re-run
(shared by the fault modules)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lab import Lab
from tests.lab.deploying import deploy, host_sh, lab_config
from tests.lab.engine import NextUp
from tests.lab.realmocks import RealMocks, StackOutputs
from tests.lab.timings import record_timing

# A node that cannot join (Ray's head, or mp's rendezvous) is found by waiting out the join
# timeout: as long as the lab needs (the head's own node is up well within it), not the
# production default (tests/program/test_validation.py checks that one); the same for both
# executors, for a like-for-like figure.
JOIN_FAULT_SECONDS = 20


def module_lab(
    lab_factory: Callable[..., Lab], name: str, engines: tuple[str, ...] = ()
) -> Iterator[Lab]:
    """A two-host bastion lab for one fault module (a fixture's body), brought down after it to
    free the machine for later modules (the factory checks for leftovers). `engines`: each
    host's Docker (lab/engines.py)."""
    lab = lab_factory(name, hosts=2, topology="bastion", engines=engines)
    yield lab
    lab.down()


def fault_runs(lab: Lab) -> Iterator[list[RealMocks]]:
    """The runs of one test (a fixture's body); the last one's journal is the stack, torn down
    at the end, and no container may be left."""
    runs: list[RealMocks] = []
    yield runs
    if runs:
        runs[-1].teardown()
    for host in lab.spec.host_names:
        assert host_sh(lab, host, "docker ps -aq") == "", f"{host}: containers left"


def failing_up(lab: Lab, runs: list[RealMocks], config: dict[str, Any] | None = None) -> str:
    mocks = NextUp(runs[-1], refresh=True) if runs else RealMocks()
    runs.append(mocks)
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        deploy(lab, mocks, config or lab_config(lab))
    record_timing("fault: time to the error", time.monotonic() - started)
    return str(caught.value)


def successful_up(
    lab: Lab, runs: list[RealMocks], config: dict[str, Any] | None = None
) -> StackOutputs:
    mocks = NextUp(runs[-1], refresh=True) if runs else RealMocks()
    runs.append(mocks)
    started = time.monotonic()
    outputs = deploy(lab, mocks, config or lab_config(lab))
    record_timing("fault: clean re-run", time.monotonic() - started)
    assert "ready after" in outputs["readiness"]
    return outputs


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def assert_no_container_started(lab: Lab) -> None:
    for host in lab.spec.host_names:
        assert host_sh(lab, host, "docker ps -aq") == "", f"{host}: no container may start"
