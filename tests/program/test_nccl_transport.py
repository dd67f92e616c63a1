"""Which transport NCCL chose, detected from real NCCL log lines (the lab has no RDMA). Each
sample is as published, with its source; Ray prefixes the lines it forwards from a rank."""

from __future__ import annotations

import pytest

import components.vllm_server as vllm_server
from stacks.plan.server import parse_fabric_transport
from tests.program.scripting import load

transport = load("nccl_transport").transport

# Two Sparks over RoCE, the lines a working setup prints (a DGX Spark cluster guide found with
# the project's search tool: "Two Sparks: NCCL over RoCE").
SPARK_ROCE = """\
NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE ; \
OOB enp1s0f1np1:192.168.100.11<0>
NCCL INFO Using network IB
"""
# A container with no verbs devices falls back (a GitHub issue's log, NCCL with the IBext plugin).
NO_DEVICE = """\
3767c65d25c4:880:887 [0] NCCL INFO P2P plugin IBext_v8
3767c65d25c4:880:887 [0] NCCL INFO NET/IB : No device found.
3767c65d25c4:880:887 [0] NCCL INFO NET/IB : No device found.
3767c65d25c4:880:887 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
3767c65d25c4:880:887 [0] NCCL INFO Using non-device net plugin version 0
3767c65d25c4:880:887 [0] NCCL INFO Using network Socket
"""
# IB disabled by environment (a WSL two-node write-up).
IB_DISABLED = """\
TUF-Node02:556:574 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
TUF-Node02:556:574 [0] NCCL INFO NET/Socket : Using [0]eth0:192.168.29.197<0>
TUF-Node02:556:574 [0] NCCL INFO Using network Socket
"""
# A RoCE cluster whose ranks Ray forwards to the driver's log (Tencent Cloud plugin lines).
RAY_FORWARDED = """\
(RayWorkerWrapper pid=4242, ip=10.241.0.12) vm-host40:34002:34044 [1] NCCL INFO NET/IB : \
Using [0]mlx5_bond_6:1/RoCE [1]mlx5_bond_7:1/RoCE [RO]; OOB bond0:30.159.184.22<0>
(RayWorkerWrapper pid=4242, ip=10.241.0.12) vm-host40:34002:34044 [1] NCCL INFO Using network IB
"""
# Channel lines only (a Kubernetes InfiniBand guide's "expected NCCL output").
CHANNELS_ONLY = "NCCL INFO Channel 01/0 : 0[0] -> 8[0] [receive] via NET/IB/4/GDRDMA\n"
# NCCL_NET=Socket with IB devices present: the choice wins over the device line.
CHOSEN_SOCKET = """\
h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>
h:1:1 [0] NCCL INFO NET/Socket : Using [0]ib0:10.0.0.1<0>
h:1:1 [0] NCCL INFO Using network Socket
"""
# AWS EFA through the libfabric plugin.
LIBFABRIC = "NCCL INFO Using network Libfabric\n"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (SPARK_ROCE, "ib rocep1s0f1:1/RoCE,roceP2p1s0f1:1/RoCE"),
        (NO_DEVICE, "socket eth0:172.17.0.2<0>"),
        (IB_DISABLED, "socket eth0:192.168.29.197<0>"),
        (RAY_FORWARDED, "ib mlx5_bond_6:1/RoCE,mlx5_bond_7:1/RoCE"),
        (CHANNELS_ONLY, "ib"),
        (CHOSEN_SOCKET, "socket ib0:10.0.0.1<0>"),
        (LIBFABRIC, "libfabric"),
        ("INFO vLLM API server version 0.16.0\nNCCL version 2.27.3+cuda13.0\n", "unknown"),
    ],
    ids=[
        "spark-roce",
        "no-device",
        "ib-disabled",
        "ray-forwarded",
        "channels",
        "nccl-net",
        "libfabric",
        "no-nccl-lines",
    ],
)
def test_the_transport_nccl_chose(log: str, expected: str) -> None:
    assert transport(log) == expected


def test_the_readiness_output_carries_it() -> None:
    readiness = 'vllm: ready after 812s; first completion: " hi"\nfabric transport: socket eth0'
    assert parse_fabric_transport(readiness) == "socket eth0"
    assert parse_fabric_transport("vllm: ready after 3s") == "unknown"


def test_a_fallback_is_warned_about_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    monkeypatch.setattr(
        vllm_server.pulumi.log, "warn", lambda message, *_: warnings.append(message)
    )
    check = vllm_server._checked_transport
    assert check("fabric transport: ib rocep1s0f1:1/RoCE", expected_rdma=True).startswith("ib")
    assert check("fabric transport: not checked (no hosts[].rdmaHcas)", expected_rdma=False)
    assert warnings == []
    assert check("fabric transport: socket eth0:10.0.0.1<0>", expected_rdma=True).startswith(
        "socket"
    )
    assert len(warnings) == 1 and "NCCL is not using RDMA between the nodes" in warnings[0]
