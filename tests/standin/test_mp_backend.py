"""The stand-in across two "nodes" without Ray (vLLM's mp executor), both on loopback: node rank
0 serves, node rank 1 runs `--headless`, and they meet at the master address and port."""

from __future__ import annotations

import json
import os
import re
import signal
import time

from .helpers import TINY_MODEL, StandinFactory, StandinProcess, free_port, http

FAST_FAILURE_S = 30
MP_ENV = {"GLOO_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}


def mp_args(master_port: int, node_rank: int, tensor_parallel_size: int = 2) -> list[str]:
    args = [
        "--tensor-parallel-size", str(tensor_parallel_size), "--pipeline-parallel-size", "1",
        "--distributed-executor-backend", "mp", "--max-model-len", "1024",
        "--nnodes", "2", "--node-rank", str(node_rank),
        "--master-addr", "127.0.0.1", "--master-port", str(master_port),
    ]  # fmt: skip
    return [*args, "--headless"] if node_rank else args


def wait_for_log(run: StandinProcess, text: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in run.log:
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{run.log}"
        time.sleep(0.2)


def pair(standin: StandinFactory, **env: str) -> tuple[StandinProcess, StandinProcess, int]:
    master = free_port()
    head = standin(TINY_MODEL, *mp_args(master, 0), env={**MP_ENV, **env})
    worker = standin(TINY_MODEL, *mp_args(master, 1), env={**MP_ENV, **env})
    return head, worker, master


def test_two_nodes_meet_at_the_master_and_serve_from_both(standin: StandinFactory) -> None:
    head, worker, master = pair(standin)
    head.wait_ready(timeout_s=60)
    request = {"model": TINY_MODEL, "prompt": "hello", "max_tokens": 4}
    status, body = http("POST", head.base_url + "/v1/completions", request)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"].startswith("ranks=127.0.0.1,127.0.0.1 ")
    assert f"head node address 127.0.0.1:{master}" in worker.log
    assert "Node rank 1 joined the process group: ranks [1]" in worker.log
    assert "rank 1: node_ip=" in head.log and "GLOO_SOCKET_IFNAME=lo" in head.log
    # A headless node serves no API.
    assert "Starting vLLM server on" not in worker.log
    for run in (head, worker):
        assert run.process is not None
        run.process.terminate()  # `docker stop`
        assert run.wait_exit(10) == 0


def test_the_head_waits_for_every_node_then_gives_up(standin: StandinFactory) -> None:
    head = standin(
        TINY_MODEL, *mp_args(free_port(), 0),
        env={**MP_ENV, "VLLM_STANDIN_RENDEZVOUS_TIMEOUT": "3"},
    )  # fmt: skip
    assert head.wait_exit(FAST_FAILURE_S) == 1
    assert "Waiting for 1 remote node(s) to join the process group" in head.log
    assert "Timed out after 3 seconds waiting for clients. 1/2 nodes joined" in head.log
    assert "missing node ranks [1]" in head.log


def test_a_headless_node_without_its_head_gives_up_connecting(standin: StandinFactory) -> None:
    """Bounded by vLLM's own --distributed-timeout-seconds (0.18.0 on), which a stack can pass
    in vllm.extraArgs."""
    worker = standin(
        TINY_MODEL, *mp_args(free_port(), 1), "--distributed-timeout-seconds", "3", env=MP_ENV
    )
    assert worker.wait_exit(FAST_FAILURE_S) == 1
    assert "The client socket has timed out after 3s while trying to connect" in worker.log


def test_a_node_with_another_world_size_is_refused(standin: StandinFactory) -> None:
    master = free_port()
    head = standin(TINY_MODEL, *mp_args(master, 0), env=MP_ENV)
    worker = standin(TINY_MODEL, *mp_args(master, 1, tensor_parallel_size=4), env=MP_ENV)
    assert head.wait_exit(FAST_FAILURE_S) == 1
    assert worker.wait_exit(FAST_FAILURE_S) == 1
    assert "runs with nnodes=2, world_size=4; node rank 0 has nnodes=2, world_size=2" in head.log
    assert "node rank 0 refused this node" in worker.log


def test_a_rank_whose_gloo_interface_is_missing_fails_the_group(standin: StandinFactory) -> None:
    master = free_port()
    head = standin(TINY_MODEL, *mp_args(master, 0), env=MP_ENV)
    worker = standin(TINY_MODEL, *mp_args(master, 1), env={**MP_ENV, "GLOO_SOCKET_IFNAME": "nope0"})
    assert head.wait_exit(FAST_FAILURE_S) == 1
    assert "Unable to find address for: nope0" in head.log and "rank 1" in head.log
    assert worker.wait_exit(FAST_FAILURE_S) == 1


def test_a_host_ip_this_node_lacks_fails_there(standin: StandinFactory) -> None:
    worker = standin(
        TINY_MODEL, *mp_args(free_port(), 1), env={**MP_ENV, "VLLM_HOST_IP": "192.0.2.123"}
    )
    assert worker.wait_exit(FAST_FAILURE_S) == 1
    assert "VLLM_HOST_IP=192.0.2.123 is not an address of" in worker.log


def test_a_dead_node_is_noticed_by_the_next_request_not_while_idle(
    standin: StandinFactory,
) -> None:
    """As vLLM: its worker monitor watches local processes only; a collective fails."""
    head, worker, _ = pair(standin, VLLM_STANDIN_HEALTH_INTERVAL="1")
    head.wait_ready(timeout_s=60)
    assert worker.process is not None
    os.killpg(worker.process.pid, signal.SIGKILL)
    time.sleep(3)  # three idle health checks
    assert head.process is not None and head.process.poll() is None
    request = {"model": TINY_MODEL, "prompt": "hello", "max_tokens": 4}
    status, body = http("POST", head.base_url + "/v1/completions", request)
    assert status == 500 and b"EngineDeadError" in body
    assert head.wait_exit(15) == 1
    assert re.search(r"node rank 1 \(127\.0\.0\.1\) stopped answering", head.log), head.log


def test_a_headless_node_whose_head_died_keeps_waiting(standin: StandinFactory) -> None:
    head, worker, _ = pair(standin)
    head.wait_ready(timeout_s=60)
    assert head.process is not None and worker.process is not None
    os.killpg(head.process.pid, signal.SIGKILL)
    wait_for_log(worker, "The head node closed the connection")
    assert worker.process.poll() is None
    worker.process.terminate()
    assert worker.wait_exit(10) == 0


def test_the_multinode_checks_vllm_makes_first(standin: StandinFactory) -> None:
    master = free_port()
    ray = [a if a != "mp" else "ray" for a in mp_args(master, 0)]
    run = standin(TINY_MODEL, *ray, env=MP_ENV)
    assert run.wait_exit(FAST_FAILURE_S) == 1
    assert "nnodes > 1 can only be set when distributed executor backend is mp" in run.log
    odd = standin(TINY_MODEL, *mp_args(master, 0, tensor_parallel_size=3), env=MP_ENV)
    assert odd.wait_exit(FAST_FAILURE_S) == 1
    assert "world_size=3 must be divisible by nnodes=2" in odd.log
    follower = [a for a in mp_args(master, 1) if a != "--headless"]
    served = standin(TINY_MODEL, *follower, env=MP_ENV)
    assert served.wait_exit(FAST_FAILURE_S) == 1
    assert "run it with --headless" in served.log
