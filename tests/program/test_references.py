"""The committed dev stack's containers carry what both public two-Spark references set (NVIDIA
dgx-spark-playbooks nvidia/vllm, eugr/spark-vllm-docker), and nothing that no one reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.program.goldens import graph

CONTAINERS = ("ray-head", "ray-spark2", "vllm-container")


@pytest.fixture
def containers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    resources = json.loads(graph("dev", tmp_path, monkeypatch))
    by_name = {r["urn"].rsplit("::", 1)[1]: r["inputs"] for r in resources}
    return {name: by_name[name] for name in CONTAINERS}


def env_of(inputs: dict[str, Any]) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in inputs["envs"])


def test_every_container_carries_the_references_settings(
    containers: dict[str, dict[str, Any]],
) -> None:
    for name, inputs in containers.items():
        env = env_of(inputs)
        assert env["RAY_memory_monitor_refresh_ms"] == "0", name  # Ray's OOM killer off
        limits = {u["name"]: (u["soft"], u["hard"]) for u in inputs["ulimits"]}
        assert limits["stack"] == (67108864, 67108864), name
        assert limits["memlock"] == (-1, -1), name  # RoCE pins its buffers
        assert inputs["devices"] == [
            {"containerPath": "/dev/infiniband", "hostPath": "/dev/infiniband"}
        ], name
        assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env["NCCL_IB_DISABLE"] == "0"
        for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            assert env[key] == "enp1s0f1np1", (name, key)
        # Which transport NCCL chose is read from the init lines (NCCL_DEBUG only there).
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"


# What something reads, and where: Ray 2.60's raylet (RAY_*), vLLM's envs.py (VLLM_*), NCCL,
# Gloo and the TensorPipe transport (*_SOCKET_IFNAME, NCCL_*), UCX, the HF hub (HF_*).
READ_BY = {
    "RAY_ADDRESS": "ray.init (the driver joins the cluster)",
    "RAY_memory_monitor_refresh_ms": "the raylet, at start",
    "VLLM_HOST_IP": "vllm/envs.py",
    # get_open_port (vllm/utils/network_utils.py) starts there: in the driver, and in the Ray
    # workers, which run under the raylet's environment (and get the driver's VLLM_* too).
    "VLLM_PORT": "vllm/envs.py",
    "NCCL_SOCKET_IFNAME": "NCCL",
    "NCCL_IB_HCA": "NCCL",
    "NCCL_IB_DISABLE": "NCCL",
    "NCCL_DEBUG": "NCCL",
    "NCCL_DEBUG_SUBSYS": "NCCL",
    "GLOO_SOCKET_IFNAME": "torch.distributed Gloo",
    "TP_SOCKET_IFNAME": "TensorPipe (torch RPC)",
    "UCX_NET_DEVICES": "UCX",
    "HF_HOME": "huggingface_hub",
    "HF_HUB_OFFLINE": "huggingface_hub",
    "HF_MODULES_CACHE": "transformers",  # dynamic_module_utils: a model's own code
    # The compile caches (stacks/plan/arguments.py compile_cache_env): in every container that
    # runs ranks (with Ray, its workers run under the raylet's environment).
    "VLLM_CACHE_ROOT": "vllm/envs.py",
    "VLLM_ENGINE_READY_TIMEOUT_S": "vllm/envs.py (v1/engine/core_client.py)",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer/jit/env.py",
    "TRITON_CACHE_DIR": "Triton's knobs",
    "TORCHINDUCTOR_CACHE_DIR": "torch/_inductor/runtime/cache_dir_utils.py",
    "CUDA_CACHE_PATH": "the CUDA driver's JIT cache",
}


def test_nothing_unread_is_set(containers: dict[str, dict[str, Any]]) -> None:
    """Every variable the program sets has a reader; RAY_NODE_IP_ADDRESS had none (absent from
    Ray 2.60's wheel) and is gone."""
    for name, inputs in containers.items():
        unread = sorted(set(env_of(inputs)) - set(READ_BY))
        assert unread == [], f"{name}: {unread} are set but nothing reads them"
        assert "RAY_NODE_IP_ADDRESS" not in env_of(inputs)
