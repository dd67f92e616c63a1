"""Too little memory for the server, tried against the lab (issue 13): a memory hog on the worker
leaves less than a fixed vllm.gpuMemoryUtilization asks, which is refused with its figures before
anything starts, and `auto` then sizes the server to what the hog left. And a start that runs
away (issue 39): the memory guard stops it before the host runs out, SSH answering throughout.

The lab's hosts share this machine's memory, so this module runs with no other lab module
beside it (`exclusive`: tests/conftest.py), after the others: what is free must not move with
another lab's work between the refusal and the sizing."""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lab import Lab
from lab.stack import PROJECT
from stacks.plan.containers import MEMORY_GUARD_MB
from stacks.plan.hardware import KV_CACHE_RESERVE_BYTES
from tests.lab.deploying import host_sh, lab_config
from tests.lab.faulting import (
    assert_no_container_started,
    failing_up,
    fault_runs,
    module_lab,
    successful_up,
    wait_for,
)
from tests.lab.realmocks import RealMocks
from tests.lab.timings import record_figure

pytestmark = [pytest.mark.lab, pytest.mark.exclusive]

WORKER = "spark2"
GIB = 1024**3


@pytest.fixture(scope="module")
def lab(lab_factory: Callable[..., Lab]) -> Iterator[Lab]:
    yield from module_lab(lab_factory, "memory")


@pytest.fixture(scope="module")
def stack(lab: Lab) -> Iterator[list[RealMocks]]:
    """One deployment for the module: the runaway start is tried on the server the first test
    sized, as a user's next `up` would meet it (no teardown and first deploy in between)."""
    yield from fault_runs(lab)


def meminfo(lab: Lab, key: str) -> int:
    """A /proc/meminfo figure in bytes, as the worker reads it."""
    kib = host_sh(lab, WORKER, f"awk '$1 == \"{key}:\" {{print $2}}' /proc/meminfo")
    return int(kib) * 1024


def mem_available(lab: Lab) -> int:
    return meminfo(lab, "MemAvailable")


def mem_total(lab: Lab) -> int:
    return meminfo(lab, "MemTotal")


@pytest.fixture
def memory_hog(lab: Lab) -> Iterator[int]:
    """A process on the worker holding 4 GiB (touched, so resident), gone after the test."""
    before = mem_available(lab)
    pid = host_sh(lab, WORKER, "setsid python3 -c 'import time; b = b\"x\" * (4 << 30); "
                               "time.sleep(900)' >/dev/null 2>&1 & echo $!")  # fmt: skip
    try:
        wait_for(lambda: mem_available(lab) < before - 3 * GIB, 60, "the hog holding its memory")
        yield 4 * GIB
    finally:
        lab.sh(WORKER, f"kill {pid} || true")


def with_utilization(lab: Lab, value: Any, **preflight: Any) -> dict[str, Any]:
    config = lab_config(lab)
    config[f"{PROJECT}:vllm"] = {**config[f"{PROJECT}:vllm"], "gpuMemoryUtilization": value}
    config[f"{PROJECT}:preflight"] = {**config[f"{PROJECT}:preflight"], **preflight}
    return config


def test_a_memory_hog_leaves_too_little_and_auto_sizes_the_server_to_what_is_left(
    lab: Lab, stack: list[RealMocks], memory_hog: int
) -> None:
    total = mem_total(lab)
    # A fraction that fitted before the hog took its 4 GiB, and does not now.
    asked = round((mem_available(lab) + memory_hog - 1.5 * GIB) / total, 2)
    error = failing_up(lab, stack, with_utilization(lab, asked))
    # The setting is echoed as given (0.9), the arithmetic with two decimals (0.90).
    found = re.search(
        rf"spark1: memory-check: vllm.gpuMemoryUtilization {asked} does not fit: .*spark2: "
        rf"{asked:.2f} x [\d.]+ GiB = [\d.]+ GiB asked, ([\d.]+) GiB free \(meminfo\).*; the "
        r"highest value that fits every node is ([\d.]+) \(auto would choose ([\d.]+), with its",
        error,
    )
    assert found, error
    free_gib, fits, auto = (float(v) for v in found.groups())
    assert fits < asked and auto < fits
    assert abs(fits - free_gib * GIB / total) < 0.02
    # Nothing of ours started: Ray waits for the memory check.
    assert_no_container_started(lab)
    # `auto` (and the page cache dropped first) sizes the server to what the hog left; with
    # vllm.kvCache auto, its KV cache in bytes from that budget too.
    config = with_utilization(lab, "auto", dropPageCache=True)
    config[f"{PROJECT}:vllm"] = {**config[f"{PROJECT}:vllm"], "kvCache": "auto"}
    outputs = successful_up(lab, stack, config)
    sizing = outputs["memory"]
    assert sizing["mode"] == "auto", sizing
    chosen = float(sizing["gpuMemoryUtilization"])
    assert chosen <= fits + 0.02, (sizing, fits)
    args = host_sh(lab, "spark1", "docker inspect --format '{{json .Args}}' spark-vllm-vllm")
    assert f'"--gpu-memory-utilization","{sizing["gpuMemoryUtilization"]}"' in args.replace(
        ", ", ","
    )
    # The KV cache: what the budget (the fraction of the smaller node) leaves beside the weights
    # and the reserve, given to vLLM, which takes it as given and says what it holds.
    kv_cache = sizing["kvCache"]
    budget = chosen * min(node["totalGib"] for node in sizing["nodes"].values()) * GIB
    expected = budget - kv_cache["weightsPerGpuGib"] * GIB - KV_CACHE_RESERVE_BYTES
    assert abs(kv_cache["kvCacheBytes"] - expected) < 0.2 * GIB, sizing
    assert f'"--kv-cache-memory-bytes","{kv_cache["kvCacheBytes"]}"' in args.replace(", ", ",")
    log = host_sh(lab, "spark1", "docker logs spark-vllm-vllm 2>&1")
    assert f"GPU KV cache size: {kv_cache['tokens']:,} tokens" in log, log[-2000:]
    record_figure(
        "KV cache sized by the memory check (vllm.kvCache: auto)",
        f"{kv_cache['kvCacheBytes'] / GIB:.1f} GiB per GPU of a {kv_cache['budgetGib']} GiB budget "
        f"({kv_cache['tokens']} tokens, {kv_cache['fullLengthRequests']} requests of "
        f"{kv_cache['maxModelLen']})",
    )


PREFIX = "spark-vllm"


def runaway(first_left: int, stop_at: int) -> str:
    """A start that runs away, as vLLM's does on GB10 (vllm#46307), run inside a container: it
    takes all but `first_left` of what is available at once, then 128 MiB every 0.25 s. It never
    takes what is left below `stop_at` itself: if the guard failed, the test fails on its
    assertions, not on this machine's OOM killer."""
    return f"""
import time
def available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
held = [b"x" * max(0, available() - {first_left})]
while True:
    if available() > {stop_at}:
        held.append(b"x" * (128 << 20))
    time.sleep(0.25)
"""


def container_id(lab: Lab, host: str, container: str) -> str:
    inspect = f"docker inspect --format '{{{{.Id}}}} {{{{.State.Status}}}}' {container} || true"
    return host_sh(lab, host, inspect)


class Watch:
    """Beside an `up`: once the head's server is a new one (not `old_server`, `ID status`) and
    runs (loading, not yet ready), `script` starts in it; meanwhile the lowest MemAvailable,
    and SSH to the worker (through the bastion, as a user) every second."""

    def __init__(self, lab: Lab, old_server: str, script: str) -> None:
        self.lab, self.old_server, self.script = lab, old_server, script
        self.lowest, self.ssh_ok, self.ssh_failed = float("inf"), 0, 0
        self.started = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _ready_to_run_away(self) -> bool:
        server = container_id(self.lab, "spark1", f"{PREFIX}-vllm")
        return server.endswith(" running") and server.split()[:1] != self.old_server.split()[:1]

    def _watch(self) -> None:
        try:
            self._run()
        except BaseException as error:  # the test reports it: a thread's error is silent
            self.error = error

    def explain(self) -> str:
        """What the watch saw, and what each guard said: for a failure's message."""
        said = {
            host: host_sh(self.lab, host, f"docker logs {PREFIX}-memory-guard 2>&1 | tail -5")
            for host in self.lab.spec.host_names
        }
        return (
            f"runaway started: {self.started.is_set()}; watch error: {self.error!r}; lowest "
            f"{self.lowest / GIB:.2f} GiB; guards: {said}"
        )

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        while not self._ready_to_run_away():
            if time.monotonic() > deadline or self.done.is_set():
                return
            time.sleep(0.5)
        script = self.script.replace("'", "'\\''")
        host_sh(self.lab, "spark1", f"docker exec -d {PREFIX}-vllm python3 -c '{script}'")
        self.started.set()
        ssh_at = 0.0
        while not self.done.is_set():
            self.lowest = min(self.lowest, mem_available(self.lab))
            if time.monotonic() - ssh_at >= 1:
                ssh_at = time.monotonic()
                answered = self.lab.ssh(WORKER, "true", timeout=10, check=False)
                if answered.returncode == 0:
                    self.ssh_ok += 1
                else:
                    self.ssh_failed += 1
            time.sleep(0.2)


def test_the_memory_guard_stops_a_runaway_start_before_the_host_runs_out(
    lab: Lab, stack: list[RealMocks]
) -> None:
    """The next `up` restarts the server slowly (a large model's load); meanwhile that start runs
    away. The head's guard stops the starting server (SIGKILL through Docker, which then
    leaves it stopped) before the host runs out; the readiness wait fails at once with the
    guard's line: the node, the container, the figures, the likely cause. The worker's guard,
    with nothing of ours starting there (executor ray: its Ray container, which the guard never
    stops), stops nothing and says so once. The `up` after it serves.

    The guard's floor here is what is available less 2.5 GiB, not its default (1 GiB on this
    machine): the runaway then takes 2.5 GiB, not all of this machine's memory (about 20 GiB,
    40 s of page faults here, with the fast tests running beside it); the guard and its path
    are the same. Measured once at the default floor: acted at 0.9 GiB available, the lowest
    seen 0.89 GiB, SSH answering 71 of 71 times."""
    available = mem_available(lab)
    floor = round((available - 2.5 * GIB) / GIB, 1)
    config = lab_config(lab)
    vllm = config[f"{PROJECT}:vllm"]
    config[f"{PROJECT}:vllm"] = {**vllm, "env": {"VLLM_STANDIN_LOAD_SECONDS": "120"}}
    guard = config[f"{PROJECT}:memoryGuard"]
    config[f"{PROJECT}:memoryGuard"] = {**guard, "minAvailableGib": floor}
    old_server = container_id(lab, "spark1", f"{PREFIX}-vllm")
    watch = Watch(lab, old_server, runaway(int((floor + 1) * GIB), int((floor - 1) * GIB)))
    watch.thread.start()
    started = time.monotonic()
    try:
        error = failing_up(lab, stack, config)
    except pytest.fail.Exception as no_error:
        raise AssertionError(f"{no_error}: {watch.explain()}") from None
    finally:
        watch.done.set()
        watch.thread.join(timeout=60)
    assert watch.started.is_set(), (error, watch.explain())
    # The lab's hosts share this machine's memory, so both guards see it low: the head's stops
    # its starting server, the worker's has nothing of ours starting and stops nothing.
    found = re.search(
        r"spark-vllm: spark1: vllm-ready: spark1: memory-guard: stopped spark-vllm-vllm \(id "
        r"\w{12}, vllm, started \d+s before\) at [\dT:Z-]+: ([\d.]+) GiB of ([\d.]+) GiB "
        r"available, below the guard's ([\d.]+) GiB",
        error,
    )
    assert found, error
    assert "likely cause: the server takes more memory than this node has while it starts" in error
    acted_at, total, guard_floor = (float(v) for v in found.groups())
    # Below the floor when it acted (both shown to a tenth of a GiB: equal is below, rounded).
    assert guard_floor == floor and acted_at <= floor, found.group(0)
    said = host_sh(lab, WORKER, f"docker logs {PREFIX}-memory-guard 2>&1")
    assert "memory-guard: stopped" not in said, said
    assert f"{WORKER}: memory-guard: memory low:" in said and "nothing stopped" in said, said
    assert host_sh(lab, WORKER, f"docker inspect --format '{{{{.State.Status}}}}' "
                                f"{PREFIX}-ray-worker") == "running"  # fmt: skip
    # Stopped by hand as far as Docker knows: its restart policy leaves it down.
    state = host_sh(lab, "spark1", f"docker inspect --format '{{{{.State.Status}}}} "
                                   f"{{{{.RestartCount}}}}' {PREFIX}-vllm")  # fmt: skip
    assert state.startswith("exited ") and state.endswith(" 0"), state
    # The host never ran out: SSH answered every second, and the runaway (512 MiB/s, the guard
    # reading twice a second) took at most 0.75 GiB past the floor.
    assert watch.ssh_failed == 0 and watch.ssh_ok >= 1, (watch.ssh_ok, watch.ssh_failed)
    assert watch.lowest > (floor - 0.75) * GIB, (watch.lowest, floor)
    usage = host_sh(lab, WORKER, f"docker stats --no-stream --format '{{{{.MemUsage}}}}' "
                                 f"{PREFIX}-memory-guard")  # fmt: skip
    guard_mib = float(re.match(r"([\d.]+)MiB", usage)[1])  # type: ignore[index]
    assert guard_mib < MEMORY_GUARD_MB, guard_mib
    record_figure(
        "memory guard: a runaway start stopped",
        f"at {acted_at} GiB available (its floor {floor} GiB of {total} GiB); lowest seen "
        f"{watch.lowest / GIB:.2f} GiB; the up failed {time.monotonic() - started:.0f} s after "
        f"it began; SSH answered {watch.ssh_ok} of {watch.ssh_ok} times; the guard itself "
        f"{guard_mib:.0f} MiB",
    )
    # The next `up`, the runaway gone with its container and the stack as it was: refresh reads
    # the stopped server (pulumi-docker sets must_run false) and the up starts it.
    outputs = successful_up(lab, stack, lab_config(lab))
    assert "ready after" in outputs["readiness"]
    # That `up` said first what the guard had stopped and was stopped still (its facts).
    log = stack[-1].program_log
    warned = [line for line in log if "it is stopped still" in line]
    assert any(f"spark1: memory-guard: stopped {PREFIX}-vllm" in w for w in warned), log


def test_a_hog_outside_the_stack_beside_a_ready_server_stops_nothing(
    lab: Lab, stack: list[RealMocks], memory_hog: int
) -> None:
    """Another user's allocation (the hog, 4 GiB) with the guard's floor above what is left:
    the servers are ready, so the guard stops none of them, nor the Ray containers, and says
    once per node that memory is low and none of ours is starting."""
    before = {host: container_id(lab, host, name) for host, name in SERVING}
    floor = round((mem_available(lab) + 1.5 * GIB) / GIB, 1)
    config = lab_config(lab)
    config[f"{PROJECT}:memoryGuard"] = {**config[f"{PROJECT}:memoryGuard"],
                                        "minAvailableGib": floor}  # fmt: skip
    outputs = successful_up(lab, stack, config)  # the guards' new floor; the servers stay
    assert "ready after" in outputs["readiness"]
    assert {host: container_id(lab, host, name) for host, name in SERVING} == before

    def said_low(host: str) -> str:
        return host_sh(lab, host, f"docker logs {PREFIX}-memory-guard 2>&1")

    def saw_low(host: str) -> bool:
        return "memory low:" in said_low(host)

    for host in lab.spec.host_names:
        wait_for(functools.partial(saw_low, host), 60, f"{host}'s guard seeing it")
    time.sleep(6)  # a guard that would act does within a look or two (every 0.5 s)
    for host in lab.spec.host_names:
        said = said_low(host)
        assert "memory-guard: stopped" not in said, said
        assert said.count("memory low:") == 1, said
    assert {host: container_id(lab, host, name) for host, name in SERVING} == before


SERVING = (("spark1", f"{PREFIX}-vllm"), ("spark1", f"{PREFIX}-ray-head"),
           ("spark2", f"{PREFIX}-ray-worker"))  # fmt: skip
