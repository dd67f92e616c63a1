"""The vLLM server on the head (joined to the Ray cluster, or with executor mp, to a headless
vLLM on every worker) and its readiness check."""

from __future__ import annotations

import functools

import pulumi
from pulumi_command import remote

from components.graph import Walk
from stacks.plan import names, server


class VllmServer(pulumi.ComponentResource):
    readiness: remote.Command  # the served model answered a real completion
    benchmark: remote.Command | None  # vllm.benchmark's measures, when asked for
    fabric_transport: pulumi.Output[str]  # which network NCCL chose (docs/operations.md, Outputs)

    def __init__(
        self, walk: Walk, name: str = names.VLLM, opts: pulumi.ResourceOptions | None = None
    ):
        """`name`: the server's slot's (`vllm`, `vllm-s1`...)."""
        super().__init__("spark-vllm:index:VllmServer", name, None, opts)
        walk.build(name, parent=self)
        self.readiness = walk.step(names.ready_of(name))
        benchmark = names.benchmark_of(name)
        self.benchmark = walk.step(benchmark) if benchmark in walk.graph.by_name else None
        self.fabric_transport = self.readiness.stdout.apply(
            functools.partial(_checked_transport, expected_rdma=walk.plan.expects_rdma)
        )
        container = walk.container(names.container_of(name))
        self.register_outputs({"containerId": container.id, "ready": self.readiness.stdout})


def _checked_transport(readiness: str, expected_rdma: bool) -> str:
    """The transport NCCL chose; a loud warning in the `pulumi up` output when hosts have HCAs
    but NCCL did not use them."""
    found = server.parse_fabric_transport(readiness)
    if expected_rdma and not found.startswith("ib"):
        pulumi.log.warn(
            f"NCCL is not using RDMA between the nodes (fabricTransport: {found}): "
            "tensor-parallel decode is then several times slower; check hosts[].rdmaHcas "
            "(ibv_devinfo), the RoCE link, and the image's NCCL (docs/troubleshooting.md)"
        )
    return found
