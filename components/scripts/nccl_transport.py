"""Which network transport NCCL chose, read from a server's log (stdin): one line out.

    ib <devices>        NCCL runs over RDMA (InfiniBand verbs: RoCE on a Spark's ConnectX)
    socket <interfaces> NCCL fell back to TCP sockets (several times slower for TP decode)
    <name>              another NCCL network plugin (Libfabric, FastSocket, ...)
    unknown             the log holds no NCCL transport line (NCCL_DEBUG not INFO, or no NCCL)

NCCL states its choice at communicator init with NCCL_DEBUG=INFO (subsystems INIT and NET):
`NCCL INFO Using network IB` or `... Socket`, which wins over the device lines (`NET/IB : Using
[0]mlx5_0:1/RoCE`, `NET/IB : No device found.`, `NET/Socket : Using [0]eth0:...`) because
NCCL_NET can select sockets with IB devices present; channel lines (`via NET/IB/0`) come next.
Lines forwarded by Ray from the ranks (`(RayWorkerWrapper pid=..) ...`) count the same.
"""

from __future__ import annotations

import re
import sys

USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+(?: \S+)?)")
CHANNEL = re.compile(r"via NET/(IB|Socket)\b")
DEVICES = re.compile(r"NCCL INFO NET/(IB|Socket) ?: Using ((?:\[\d+\]\S+ ?)+)")
NO_IB = re.compile(r"NCCL INFO NET/IB ?: No device found")


def transport(log: str) -> str:
    chosen = USING_NETWORK.findall(log)
    channels = CHANNEL.findall(log)
    devices = {kind: found for kind, found in DEVICES.findall(log)}
    if chosen:
        kind = {"ib": "IB", "socket": "Socket"}.get(chosen[-1].lower(), chosen[-1])
        if kind not in ("IB", "Socket"):
            return kind.lower().replace(" ", "-")
    elif channels:
        kind = channels[-1]
    elif "IB" in devices:
        kind = "IB"
    elif NO_IB.search(log) or "Socket" in devices:
        kind = "Socket"
    else:
        return "unknown"
    names = re.findall(r"\[\d+\](\S+)", devices.get(kind, ""))
    return f"{kind.lower()} {','.join(names)}".strip()


if __name__ == "__main__":
    print(transport(sys.stdin.read()))
