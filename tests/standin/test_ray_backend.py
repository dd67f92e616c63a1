"""The stand-in on a real single-node Ray (2 logical GPUs), as vLLM's Ray executor behaves."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import DRIVER_ONLY_MODEL, TINY_MODEL, LocalRay, StandinFactory, http

FAST_FAILURE_S = 60  # start-up errors must surface well inside this bound
UNASSIGNED_IP = "192.0.2.123"  # TEST-NET-1: never a Ray node here


def ray_env(cluster: LocalRay, **extra: str) -> dict[str, str]:
    return {"RAY_ADDRESS": cluster.address, "VLLM_STANDIN_PLACEMENT_TIMEOUT": "20", **extra}


def ray_serve_args(tensor_parallel_size: int) -> list[str]:
    return [
        "--tensor-parallel-size", str(tensor_parallel_size), "--pipeline-parallel-size", "1",
        "--distributed-executor-backend", "ray", "--max-model-len", "1024",
    ]  # fmt: skip


def test_tp2_becomes_ready_and_serves_from_both_ranks(
    local_ray: LocalRay, standin: StandinFactory
) -> None:
    # A driver's VLLM_* reach its Ray workers, as vLLM copies them (vllm/ray/ray_env.py); the
    # lab shows the launcher's non-carry-over file keeping VLLM_API_KEY back (test_e2e.py).
    env = {**ray_env(local_ray), "VLLM_API_KEY": "k", "VLLM_CONFIG_ROOT": "/nonexistent"}
    server = standin(TINY_MODEL, *ray_serve_args(2), env=env)
    server.wait_ready(timeout_s=120)
    assert server.log.count("api_key_carried=yes") == 2, server.log
    status, body = http("GET", server.base_url + "/v1/models", api_key="k")
    assert status == 200
    assert json.loads(body)["data"][0]["id"] == TINY_MODEL
    request = {"model": TINY_MODEL, "prompt": "hello", "max_tokens": 4}
    status, body = http("POST", server.base_url + "/v1/completions", request, api_key="k")
    assert status == 200, body
    text = json.loads(body)["choices"][0]["text"]
    assert re.match(r"ranks=[\d.]+,[\d.]+ ", text), text
    assert "rank 0: node_ip=" in server.log
    assert "rank 1: node_ip=" in server.log
    assert "GLOO_SOCKET_IFNAME=lo" in server.log
    assert server.process is not None
    server.process.terminate()  # `docker stop`
    assert server.wait_exit(10) == 0


def test_dead_rank_stops_the_server(local_ray: LocalRay, standin: StandinFactory) -> None:
    server = standin(
        TINY_MODEL, *ray_serve_args(2),
        env=ray_env(local_ray, VLLM_STANDIN_HEALTH_INTERVAL="1", VLLM_STANDIN_HEALTH_TIMEOUT="5"),
    )  # fmt: skip
    server.wait_ready(timeout_s=120)
    rank1_pid = int(re.search(r"rank 1: .* pid=(\d+)", server.log).group(1))  # type: ignore[union-attr]
    os.kill(rank1_pid, signal.SIGKILL)  # a worker process this test's Ray started
    assert server.wait_exit(30) == 1
    assert "EngineDeadError" in server.log
    assert "rank 1" in server.log


def test_more_ranks_than_gpus_fails_fast(local_ray: LocalRay, standin: StandinFactory) -> None:
    server = standin(TINY_MODEL, *ray_serve_args(4), env=ray_env(local_ray))
    assert server.wait_exit(FAST_FAILURE_S) == 1
    assert (
        "The number of required GPUs exceeds the total number of available GPUs "
        "in the placement group" in server.log
    )


def test_driver_ip_that_is_no_ray_node_fails_within_the_timeout(
    local_ray: LocalRay, standin: StandinFactory
) -> None:
    env = ray_env(local_ray, VLLM_HOST_IP=UNASSIGNED_IP, VLLM_STANDIN_PLACEMENT_TIMEOUT="4")
    server = standin(TINY_MODEL, *ray_serve_args(2), env=env)
    assert server.wait_exit(FAST_FAILURE_S) == 1
    assert "No available node types can fulfill resource request" in server.log
    assert f"'node:{UNASSIGNED_IP}'" in server.log
    assert "alive node IPs: [" in server.log


def test_sigterm_during_the_placement_wait_exits_promptly(
    local_ray: LocalRay, standin: StandinFactory
) -> None:
    env = ray_env(local_ray, VLLM_HOST_IP=UNASSIGNED_IP, VLLM_STANDIN_PLACEMENT_TIMEOUT="60")
    server = standin(TINY_MODEL, *ray_serve_args(2), env=env)
    deadline = time.monotonic() + FAST_FAILURE_S
    while "Waiting for creating a placement group" not in server.log:
        assert time.monotonic() < deadline, server.log
        assert server.process is not None and server.process.poll() is None, server.log
        time.sleep(0.3)
    assert server.process is not None
    server.process.terminate()
    assert server.wait_exit(5) == 0


def test_snapshot_missing_on_a_rank_names_its_node(
    local_ray: LocalRay, standin: StandinFactory
) -> None:
    server = standin(DRIVER_ONLY_MODEL, *ray_serve_args(2), env=ray_env(local_ray))
    assert server.wait_exit(FAST_FAILURE_S) == 1
    assert re.search(r"Model weights not available on rank 0 on node [\d.]+", server.log)
    assert f"no local snapshot of {DRIVER_ONLY_MODEL}@main" in server.log


def test_without_ray_address_a_private_ray_has_no_gpus(standin: StandinFactory) -> None:
    server = standin(TINY_MODEL, *ray_serve_args(2))
    assert server.wait_exit(120) == 1
    assert "RAY_ADDRESS is not set" in server.log
    assert "The number of required GPUs exceeds the total number" in server.log


@pytest.fixture
def ray_with_bad_gloo(standin_bin: Path, ray_hf_home: Path) -> Iterator[LocalRay]:
    cluster = LocalRay(standin_bin, ray_hf_home, gloo_ifname="nosuchif0")
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


def test_gloo_interface_missing_on_a_node_fails_like_gloo(
    ray_with_bad_gloo: LocalRay, standin: StandinFactory
) -> None:
    server = standin(TINY_MODEL, *ray_serve_args(2), env=ray_env(ray_with_bad_gloo))
    assert server.wait_exit(FAST_FAILURE_S) == 1
    assert "Unable to find address for: nosuchif0" in server.log
