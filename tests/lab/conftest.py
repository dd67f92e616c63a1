"""Shared lab fixtures: simulated Spark hosts (lab/) brought up once per test session.

`lab_bastion` is the default lab (bastion + spark1, spark2, image and model on spark1).
`lab_factory(name, **spec_fields)` brings up any other LabSpec; every lab it made is torn down
(and checked to leave nothing behind) at the end of the session.

Each session claims a free "slot" (a lock file), which picks its prefixes, subnets and state
dirs, so two test sessions on one machine (or a user's own `python -m lab up`) never collide.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

# The project is not an installed package (tool.uv package = false) and pytest puts only this
# directory on sys.path: make the repository root importable for `lab`.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from lab import Lab, LabSpec, leftovers, missing_prerequisites  # noqa: E402

TEST_ROOT = Path("/var/lib/spark-vllm-lab-tests")
SLOTS = 8


def require_lab_prerequisites() -> None:
    """Skip (with the reason) where the lab cannot run; on CI (CI=true) fail instead."""
    missing = missing_prerequisites()
    if not missing:
        return
    reason = "lab prerequisites missing: " + ", ".join(missing) + " (see lab/install-deps.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@contextlib.contextmanager
def claimed_slot() -> Iterator[int]:
    TEST_ROOT.mkdir(parents=True, exist_ok=True)
    for slot in range(SLOTS):
        handle: IO[str] = (TEST_ROOT / f"slot{slot}.lock").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield slot
        finally:
            handle.close()
        return
    raise RuntimeError(f"all {SLOTS} lab test slots under {TEST_ROOT} are in use")


def spec_for(slot: int, index: int, name: str, **fields: Any) -> LabSpec:
    """Slot s, lab k of the session: 10.250.(16s+k).0/30 outside, 10.251.x mgmt, 10.252.x fabric."""
    octet = slot * 16 + index
    defaults: dict[str, Any] = {
        "prefix": f"t{slot}l{index}",
        "outside_subnet": f"10.250.{octet}.0/30",
        "mgmt_subnet": f"10.251.{octet}.0/24",
        "fabric_subnet": f"10.252.{octet}.0/24",
        "state_dir": TEST_ROOT / f"s{slot}-{name}",
    }
    defaults.update(fields)
    return LabSpec(**defaults)


@pytest.fixture(scope="session")
def lab_factory() -> Iterator[Callable[..., Lab]]:
    """lab_factory(name, **LabSpec fields) -> a Lab that is up (its LabInfo: lab.info());
    the same name returns the same lab."""
    require_lab_prerequisites()
    made: dict[str, Lab] = {}
    with claimed_slot() as slot:

        def make(name: str, **fields: Any) -> Lab:
            if name not in made:
                if len(made) >= 16:
                    raise RuntimeError("at most 16 labs per test session")
                lab = Lab(spec_for(slot, len(made), name, **fields))
                lab.down()  # whatever a crashed earlier session left in this slot
                lab.up()
                made[name] = lab
            return made[name]

        try:
            yield make
        finally:
            problems = []
            for lab in made.values():
                lab.down()
                problems += leftovers(lab.spec)
            assert not problems, f"lab teardown left: {problems}"


@pytest.fixture(scope="session")
def lab_bastion(lab_factory: Callable[..., Lab]) -> Lab:
    """bastion + spark1 (head: lab image, HF model) + spark2."""
    return lab_factory("bastion", hosts=2, topology="bastion")
