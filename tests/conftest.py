"""Suite-wide hooks: the order modules run in, where the time went, and the lab's figures.

The suite runs on pytest-xdist workers (`-n 2 --dist loadscope`, pyproject.toml): a module is
one unit of work, so a lab module's deployment stays on one worker. The lab modules spend most
of their time waiting on the simulated hosts (half the CPU idle in a serial run), so two of them
side by side, with the fast tests filling the gaps, finish in far less wall time than one after
another. The longest modules start first (`MODULE_COST`), so that no long one starts last.

A module marked `exclusive` (it measures this machine's free memory, which every lab shares)
runs with no other lab or stand-in module beside it: it takes the machine's lock exclusively,
while every other such module holds it shared for as long as it runs. Exclusive modules start
after the costly ones, while the other worker goes on with the fast tests, which take no lock.

The lab's figures are recorded in each worker's process (tests/lab/timings.py); a worker hands
them to the controller when it finishes (`workeroutput`), and the controller prints them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import timings

# Seconds each costly module took in the last full run (pytest prints them under "time by
# phase and module"): the order work starts in. A module not listed counts as fast and goes
# after these.
MODULE_COST: dict[str, float] = {
    # Real vLLM (its CPU build): the image built once per run, torch.compile cold then warm.
    # With day two, the longest: they start first, so that neither ends last. On the real CLI,
    # with PyPI's CUDA torch (an 8 GB image): 1188 s before the image was made lean.
    "tests/lab/test_real_vllm.py": 1150,
    "tests/lab/test_day_two.py": 1017,
    "tests/lab/test_faults.py": 749,
    # Every model change beside a serving one, keys, monitoring: long; not exclusive, so it
    # starts with the costly ones rather than last, alone, after the exclusive module.
    "tests/lab/test_several_models.py": 437,
    "tests/standin/test_conformance.py": 333,
    "tests/lab/test_e2e.py": 322,
    "tests/lab/test_executor_mp.py": 240,  # the real CLI: the lifecycle, day two, destroy
    "tests/lab/test_bench.py": 260,
    "tests/lab/test_day_two_grow.py": 183,
    "tests/lab/test_hardware_faults.py": 160,
    "tests/standin/test_ray_backend.py": 73,
    "tests/lab/test_lab_infra.py": 44,
    "tests/standin/test_mp_backend.py": 27,
    "tests/lab/test_realmocks.py": 22,
}
_WORKER_KEY = "spark_vllm_lab_figures"


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _exclusive(item: pytest.Item) -> bool:
    return item.get_closest_marker("exclusive") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Costly modules first, longest first; then the other heavy ones (labs, stand-ins); then
    the exclusive ones; then the fast ones, in pytest's order (a stable sort). Every xdist
    worker sorts its identical collection the same way.

    The exclusive module goes after every heavy one, so that the other worker runs the fast
    tests beside it (they take no lock): a heavy module after it waited the exclusive one out
    doing nothing (CI of 2cea640: 157 s of the realmocks module's setup)."""

    def order(item: pytest.Item) -> tuple[int, float]:
        cost = MODULE_COST.get(_module(item.nodeid))
        if cost is not None:
            return (0, -cost)
        if _exclusive(item):
            return (2, 0.0)
        return (1, 0.0) if item.nodeid.startswith(_HEAVY) else (3, 0.0)

    items.sort(key=order)


# Machine-wide, not per run: a second test session on this machine shares its memory too.
_LOCKS = Path(tempfile.gettempdir()) / "spark-vllm-tests"
_HEAVY = ("tests/lab/", "tests/standin/")  # modules that run labs, Ray or servers


@contextlib.contextmanager
def _machine(exclusive: bool) -> Iterator[None]:
    """The machine's lock, behind a turnstile: a module takes the turnstile before its shared
    lock, and an exclusive one holds the turnstile while it waits, so that modules starting
    after it asked cannot keep it waiting."""
    _LOCKS.mkdir(exist_ok=True)
    with (
        (_LOCKS / "turnstile.lock").open("a") as turnstile,
        (_LOCKS / "machine.lock").open("a") as machine,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture(scope="module", autouse=True)
def _machine_share(request: pytest.FixtureRequest) -> Iterator[None]:
    """Held for the whole module, its labs' teardown included (set up before the module's own
    fixtures, so torn down after them)."""
    module: pytest.Module = request.node
    if not module.nodeid.startswith(_HEAVY):
        yield
        return
    with _machine(exclusive=module.get_closest_marker("exclusive") is not None):
        yield


class _Clock:
    """Per test module and per phase (a folder under tests/): summed seconds and wall span."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.spans: dict[str, tuple[float, float]] = {}
        self.started = time.time()

    def add(self, report: pytest.TestReport) -> None:
        module = _module(report.nodeid)
        phase = "/".join(module.split("/")[:2])
        for key in (module, phase):
            self.seconds[key] += report.duration
            first, last = self.spans.get(key, (report.start, report.stop))
            self.spans[key] = (min(first, report.start), max(last, report.stop))


_CLOCK = _Clock()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # On the controller this sees every worker's reports too (xdist replays them).
    _CLOCK.add(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the lab's figures to the controller
        workeroutput[_WORKER_KEY] = json.dumps(timings.export())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: a worker finished; keep the figures it recorded."""
    exported = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if exported:
        timings.merge(json.loads(exported))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    _print_lab_figures(terminalreporter)
    _print_time_by_phase(terminalreporter)


def _print_time_by_phase(terminalreporter: Any) -> None:
    if not _CLOCK.spans:
        return
    terminalreporter.section("time by phase and module (summed test time; wall span from start)")
    phases = sorted(key for key in _CLOCK.spans if not key.endswith(".py"))
    for phase in phases:
        _write_row(terminalreporter, phase)
        modules = [key for key in _CLOCK.spans if key.startswith(phase + "/")]
        for module in sorted(modules, key=lambda key: -_CLOCK.seconds[key]):
            if _CLOCK.seconds[module] >= 5:
                _write_row(terminalreporter, module, indent="  ")


def _write_row(terminalreporter: Any, key: str, indent: str = "") -> None:
    first, last = _CLOCK.spans[key]
    terminalreporter.write_line(
        f"{indent}{key}: {_CLOCK.seconds[key]:.0f} s of tests, "
        f"from {first - _CLOCK.started:.0f} s to {last - _CLOCK.started:.0f} s"
    )


def _print_lab_figures(terminalreporter: Any) -> None:
    """How long the end-to-end runs took, the day-two plans, and other figures (CI logs keep
    them)."""
    if timings.TIMINGS:
        terminalreporter.section("lab timings")
        for what, seconds in timings.TIMINGS:
            terminalreporter.write_line(f"{what}: {seconds:.1f} s")
    if timings.DAY_TWO:
        terminalreporter.section("day two (plan, wall time, serving downtime)")
        for scenario, counts, seconds, downtime in timings.DAY_TWO:
            terminalreporter.write_line(
                f"{scenario}: {counts}; {seconds:.1f} s; downtime {downtime:.1f} s"
            )
    if timings.FIGURES:
        terminalreporter.section("lab figures")
        for what, value in timings.FIGURES:
            terminalreporter.write_line(f"{what}: {value}")
