"""vllm.executor mp: vLLM's own multi-node mode, one vLLM container per node and no Ray."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.program.conftest import SECRETS, ConfigFactory
from tests.program.harness import Evaluation, evaluate, fake_id


def mp_config(make_config: ConfigFactory, hosts: int = 2, **vllm: Any) -> dict[str, Any]:
    """A stack that does not set vllm.executor: mp is the default."""
    config = make_config(hosts=hosts, executor=None)
    config["vllm"] = {**config["vllm"], **vllm}
    return config


@pytest.fixture
def mp(make_config: ConfigFactory) -> Evaluation:
    config = mp_config(make_config)
    assert "executor" not in config["vllm"]
    return evaluate(config, SECRETS)


def serve_args(ev: Evaluation, name: str) -> tuple[list[str], list[str]]:
    command = ev.named(name).inputs["command"]
    split = command.index("--")
    return command[:split], command[split + 1 :]


def env_of(ev: Evaluation, name: str) -> dict[str, str]:
    return dict(e.split("=", 1) for e in ev.named(name).inputs["envs"])


def test_no_ray_runs_and_every_node_has_its_own_server(mp: Evaluation) -> None:
    names = {r.name for r in mp.registrations}
    assert not {n for n in names if n.startswith("ray")}, sorted(names)
    assert {"vllm-container", "vllm-spark2", "vllm-ready"} <= names
    assert mp.outputs["executor"] == "mp"
    head, worker = mp.named("vllm-container").inputs, mp.named("vllm-spark2").inputs
    assert head["name"] == worker["name"] == "spark-vllm-vllm"
    # No Ray driver looks for a raylet: the server keeps its own PID namespace.
    assert head.get("pidMode") is None and worker.get("pidMode") is None
    assert head["restart"] == worker["restart"] == "unless-stopped"


def test_the_head_is_node_rank_0_and_the_worker_runs_headless(mp: Evaluation) -> None:
    head_flags, head = serve_args(mp, "vllm-container")
    worker_flags, worker = serve_args(mp, "vllm-spark2")
    rendezvous = ["--nnodes", "2", "--master-addr", "10.241.0.11", "--master-port", "29501"]
    for args in (head, worker):
        assert args[args.index("--distributed-executor-backend") + 1] == "mp"
        for flag, value in zip(rendezvous[::2], rendezvous[1::2], strict=True):
            assert args[args.index(flag) + 1] == value
    assert head[head.index("--node-rank") + 1] == "0" and "--headless" not in head
    assert worker[worker.index("--node-rank") + 1] == "1" and "--headless" in worker

    def without_rank(args: list[str]) -> list[str]:
        at = args.index("--node-rank")
        return [a for a in args[:at] + args[at + 2 :] if a != "--headless"]

    # Otherwise the same serving arguments on every node.
    assert without_rank(head) == without_rank(worker)
    assert head_flags[head_flags.index("--peers") + 1] == "spark2=10.241.0.12"
    # vLLM's own port, on loopback: the front publishes 8000.
    assert head_flags[head_flags.index("--health-url") + 1] == "http://127.0.0.1:8001/health"
    assert worker_flags[worker_flags.index("--peers") + 1] == "spark1=10.241.0.11"
    # Only the head serves: only it reads the API key.
    assert "--key-file" in head_flags and "--key-file" not in worker_flags
    assert "--health-url" not in worker_flags
    mounts = {m["target"] for m in mp.named("vllm-spark2").inputs["mounts"]}
    assert "/run/spark-vllm" not in mounts


def test_each_node_gets_its_own_interfaces_and_no_ray_settings(mp: Evaluation) -> None:
    head, worker = env_of(mp, "vllm-container"), env_of(mp, "vllm-spark2")
    assert head["VLLM_HOST_IP"] == "10.241.0.11" and worker["VLLM_HOST_IP"] == "10.241.0.12"
    assert head["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert worker["GLOO_SOCKET_IFNAME"] == worker["NCCL_SOCKET_IFNAME"] == "enP2p1s0f1np1"
    for env in (head, worker):
        assert env["VLLM_PORT"] == "29502"
        assert not [key for key in env if key.startswith("RAY_")], env


def test_the_head_starts_after_the_worker_and_the_wait_after_both(mp: Evaluation) -> None:
    """A replaced worker replaces the server too (its ID is a label there): a new worker never
    meets a server whose group already formed."""
    assert mp.depends_on("vllm-container", "vllm-spark2")
    assert not mp.depends_on("vllm-spark2", "vllm-container")
    worker = mp.named("vllm-spark2")
    worker_id = fake_id(worker.typ, worker.name, json.dumps(worker.inputs, sort_keys=True))
    labels = {lab["label"]: lab["value"] for lab in mp.named("vllm-container").inputs["labels"]}
    assert labels["spark-vllm.mp-nodes"] == worker_id
    assert mp.depends_on("vllm-spark2", "memory-check")
    assert mp.depends_on("vllm-spark2", "image-spark2-sync")
    assert mp.depends_on("vllm-container", "memory-check")
    ready = mp.named("vllm-ready").inputs
    assert len(ready["triggers"]) == 3  # the server, the worker's, and the front it asks through
    assert "--executor mp --rendezvous 10.241.0.11:29501" in ready["create"]
    assert "spark2|ssh://aurora@10.241.0.12:22|spark-vllm-vllm" in ready["create"]


def test_preflight_and_firewall_cover_the_rendezvous_not_rays_ports(mp: Evaluation) -> None:
    head = mp.named("spark1-preflight").inputs["create"]
    worker = mp.named("spark2-preflight").inputs["create"]
    # What each listens on, its message queues' range too: free, or this stack's own.
    assert "--ports 8000,8404,8001,29501,29502:29533 " in head
    assert "--ports 29502:29533 " in worker
    # What the guard will drop (Ray's ports too): no other process's, never SSH's.
    assert "--guarded 6379,10001,6380," in head and ",29501,8001,19100 " in head

    def guarded(host: str) -> str:
        words = mp.named(f"firewall-{host}-guard").inputs["command"]
        return str(words[words.index("--tcp-ports") + 1])

    # Ray's too: a switch of executors leaves the rules as they are.
    # Then node_exporter's, held whether or not monitoring is on (stacks/plan/firewall.py).
    assert guarded("spark1").endswith(",10002:10999,29502:29533,29501,8001,19100")
    assert guarded("spark2").endswith(",10002:10999,29502:29533,19100")


def test_the_image_need_not_carry_ray(mp: Evaluation) -> None:
    for node in ("spark1", "spark2"):
        assert "--executor mp" in mp.named(f"image-{node}-facts").inputs["create"]


def test_ray_settings_with_mp_are_a_warning(make_config: ConfigFactory) -> None:
    config = mp_config(make_config)
    config["ray"] = {"port": 7000}
    ev = evaluate(config, SECRETS)
    assert any("ray: port set, but vllm.executor is mp" in w for w in ev.warnings), ev.warnings


def test_three_nodes_take_ranks_in_hosts_order(make_config: ConfigFactory) -> None:
    ev = evaluate(mp_config(make_config, hosts=3, tensorParallelSize=3), SECRETS)
    for rank, node in ((1, "spark2"), (2, "spark3")):
        _, args = serve_args(ev, f"vllm-{node}")
        assert args[args.index("--node-rank") + 1] == str(rank)
        assert args[args.index("--nnodes") + 1] == "3"
    head_flags, _ = serve_args(ev, "vllm-container")
    assert head_flags[head_flags.index("--peers") + 1] == "spark2=10.241.0.12,spark3=10.241.0.13"


@pytest.mark.parametrize("executor", ["mp", "ray"])
def test_every_rank_keeps_its_compile_caches_on_the_host_and_vllm_never_gives_up_first(
    make_config: ConfigFactory, executor: str
) -> None:
    """The caches a replaced server would otherwise compile again live in each node's
    <leaf>/compile-cache, in every container that runs ranks (with Ray, the Ray containers)."""
    config = make_config(hosts=2, executor=executor)
    ev = evaluate(config, SECRETS)
    names = ["vllm-container", "vllm-spark2"] if executor == "mp" else ["ray-head", "ray-spark2"]
    for name in names:
        env = env_of(ev, name)
        assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "21600", name  # vllmReadySeconds' ceiling
        assert env["VLLM_CACHE_ROOT"] == "/spark-vllm/cache/vllm"
        assert env["FLASHINFER_WORKSPACE_BASE"] == "/spark-vllm/cache"
        assert env["TRITON_CACHE_DIR"] == "/spark-vllm/cache/triton"
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/spark-vllm/cache/inductor"
        assert env["CUDA_CACHE_PATH"] == "/spark-vllm/cache/nv-compute"
        mounts = {m["target"]: m for m in ev.named(name).inputs["mounts"]}
        cache = mounts["/spark-vllm/cache"]
        assert cache["source"] == "/home/aurora/.spark-vllm/spark-vllm.dev/compile-cache"
        assert not cache.get("readOnly")
    node = "spark2"
    step = ev.named(f"compile-cache-{node}").inputs
    assert "compile-cache.sh report" in step["create"]
    assert "--keep no" in step["delete"]
    assert "--image spark-vllm.invalid/image:sha256-" in step["delete"]


def test_our_wait_changes_no_serving_container(make_config: ConfigFactory) -> None:
    """vLLM's own engine-ready wait is the ceiling of ours, a constant: raising
    timeouts.vllmReadySeconds updates the wait and replaces no server nor Ray container. The
    memory guards are replaced: the wait is their start window (a server not ready within it
    is no longer one starting, memory_guard.py), and no server's memory is theirs."""
    from tests.program.previews import plan

    before = make_config(hosts=2, executor=None)
    after = make_config(hosts=2, executor=None, timeouts={"vllmReadySeconds": 2400})
    assert plan(before, after) == {
        "vllm-ready": "update",
        "memory-guard-spark1": "replace",
        "memory-guard-spark2": "replace",
    }


@pytest.mark.parametrize(
    "key", ["VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "VLLM_ENGINE_READY_TIMEOUT_S"]
)
def test_vllm_env_cannot_move_the_caches_or_vllms_own_wait(
    make_config: ConfigFactory, key: str
) -> None:
    config = make_config(hosts=2, executor=None)
    config["vllm"] = {**config["vllm"], "env": {key: "/root/elsewhere"}}
    with pytest.raises(Exception, match=f"vllm.env.{key}: "):
        evaluate(config, SECRETS)
