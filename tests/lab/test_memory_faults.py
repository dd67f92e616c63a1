"""Too little memory for the server, tried against the lab (issue 13): a memory hog on the worker
leaves less than a fixed vllm.gpuMemoryUtilization asks, which is refused with its figures before
anything starts, and `auto` then sizes the server to what the hog left.

The lab's hosts share this machine's memory, so this module runs with no other lab module
beside it (`exclusive`: tests/conftest.py), after the others: what is free must not move with
another lab's work between the refusal and the sizing."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lab import Lab
from lab.stack import PROJECT
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


@pytest.fixture
def stack(lab: Lab) -> Iterator[list[RealMocks]]:
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
