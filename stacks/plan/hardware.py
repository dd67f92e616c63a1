"""What the hardware must show before the deployment trusts it, as pure specs: the fabric link
between the head and each worker (MTU, negotiated speed, measured throughput), and the memory
the server will find on every node, which sizes it (vllm.gpuMemoryUtilization, or `auto`).
Kernel, driver and RDMA port facts are read by preflight (stacks/plan/hosts.py
preflight_flags); `hardware_warnings` compares them across nodes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from stacks.fleet import MIN_AUTO_SHARE, SERVER_OVERHEAD_SHARE
from stacks.plan import names
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.fabric import fabric_flags
from stacks.plan.later import KV_BLOCK_SIZE, WEIGHTS_COMMIT
from stacks.plan.server_plan import ServerPlan, per_server, servers_on, serving_container_names
from stacks.plan.steps import StepSpec, Timeouts, script_call
from stacks.plan.weights import filter_flags

GIB = 1024**3

# Seconds the link test sends for: long enough for TCP to leave slow start on a 200G link and
# for a shaped link's bucket to drain, short enough to cost nothing next to the copies.
LINK_TEST_SECONDS = 3

# `auto` leaves this much of each node's memory unasked: 5% of the total (6 GiB of a Spark's
# 121.7 GiB), at least 2 GiB. What it covers: vLLM's profiling can exceed the budget it was
# given (vllm-project/vllm#46307), CUDA graphs, NCCL's buffers and the Python processes grow
# after the measurement, and on GB10 what CUDA finds free moves by a few GiB between starts and
# with the page cache (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47).
AUTO_MARGIN_FRACTION = 0.05
AUTO_MIN_MARGIN_BYTES = 2 * GIB

# vllm.kvCache: what the server allocates per GPU besides its weights and the KV cache, kept
# out of the cache's bytes. Given --kv-cache-memory-bytes (vLLM 0.10.2 on), vLLM takes the bytes
# as they are and measures nothing else (vllm/v1/worker/gpu_worker.py determine_available_memory):
# the activation peak of a max_num_batched_tokens step, CUDA graphs, and what is not torch's
# (CUDA context, NCCL buffers) are ours to leave room for. eugr/spark-vllm-docker PR #286 finds
# the non-torch share near 2 GiB on GB10 once compile's transient host memory is left out; CUDA
# graphs and the activations of the models served here take a few GiB more. On unified memory
# running out freezes the host, so this errs high; a stack that knows better sets bytes.
KV_CACHE_RESERVE_BYTES = 6 * GIB

# The least /dev/shm a node running servers needs when docker.shmSizeMb is unset. The Ray and
# vLLM containers run with --ipc=host, so Docker's --shm-size does not apply and they share the
# host's tmpfs: vLLM's shared-memory message queues and Ray's object store live there, and a full
# /dev/shm kills vLLM with SIGBUS (vllm PR #48879; Docker's own 64 MiB default is the usual
# victim). 1 GiB is far above the queues and far below a stock /dev/shm (half the memory: about
# 60 GiB on a Spark), so it catches only a host that mounts a small tmpfs there.
SHM_FLOOR_MB = 1024

FABRIC_LINK_PREFIX = "spark-vllm-fabric-link "
MEMORY_SIZING_PREFIX = "spark-vllm-memory-sizing "


def shm_need_bytes(plan: ClusterPlan, node: NodePlan) -> int:
    """What the Ray and vLLM containers on `node` need of its /dev/shm together: with --ipc=host
    they share the host's, so docker.shmSizeMb once per container; unset, SHM_FLOOR_MB."""
    each = plan.config.docker.shm_size_mb
    if each is None:
        return SHM_FLOOR_MB * 1024**2
    servers = servers_on(plan, node)
    vllm = sum(1 for server in servers if not server.uses_ray or server.runs_server(node))
    ray = 1 if any(server.uses_ray for server in servers) else 0
    return (vllm + ray) * each * 1024**2


def shm_use_bytes(plan: ClusterPlan, node: NodePlan) -> int:
    """What the containers on `node` may put in the host's /dev/shm together: their needs
    (shm_need_bytes) and, where Ray runs, its object store (Ray keeps it in /dev/shm when it
    fits). On unified memory preflight holds it to what the servers' fraction leaves."""
    ray = any(server.uses_ray for server in servers_on(plan, node))
    store = plan.config.ray.object_store_memory_bytes if ray else 0
    return shm_need_bytes(plan, node) + store


def fabric_link(plan: ClusterPlan, worker: NodePlan) -> StepSpec:
    """On the head, before anything is copied to `worker`: the same (or fabric.mtu's) MTU on
    both ends, and TCP throughput at least fabric.minLinkGbps (fabric-link.sh)."""
    fabric = plan.config.fabric
    flags: dict[str, str | float] = {
        "worker": worker.name,
        "target": worker.fabric_destination,
        "interface": plan.head.fabric_interface,
        "worker_interface": worker.fabric_interface,
        "worker_ip": worker.fabric_ip,
        "worker_bin": worker.bin_dir,
        "mtu": fabric.mtu if fabric.mtu is not None else "any",
        "min_gbps": f"{fabric.min_link_gbps:g}",  # as the user wrote it: 20, 12.5
        "seconds": LINK_TEST_SECONDS,
        **fabric_flags(plan),
    }
    return StepSpec(
        name=names.link_of(worker.name),
        node=plan.head,
        create=script_call(plan.head, "fabric-link.sh", **flags),
        timeouts=Timeouts(create=3),
    )


def memory_check(plan: ServerPlan) -> StepSpec:
    """On the head, once the image and the weights are on every node and before Ray or the
    server starts: what each node will have free for the server, against the configured
    fraction, or the fraction `auto` derives (memory-check.sh, memory-probe.sh on each node);
    with vllm.kvCache, the KV cache's bytes too, from the head's snapshot (kv_sizing.py)."""
    cfg = plan.config
    # One node a line: a state dir may hold a space.
    nodes = "\n".join(
        f"{n.name}|{'-' if n.is_head else n.fabric_destination}|{n.bin_dir}|"
        + ",".join(serving_container_names(plan, n))
        + f"|{n.fabric_ip}"
        for n in plan.nodes
    )
    flags: dict[str, str | float] = {
        "nodes": nodes,
        "image": plan.pinned_image.text,
        "gpus": "yes" if cfg.docker.request_gpus else "no",
        "drop_page_cache": "yes" if cfg.preflight.drop_page_cache else "no",
        "utilization": str(plan.served.settings.gpu_memory_utilization),
        "margin_fraction": AUTO_MARGIN_FRACTION,
        "min_margin_bytes": AUTO_MIN_MARGIN_BYTES,
        "server_container": plan.vllm_container,
        # A server on a worker: its arguments are read there.
        **(
            {} if plan.server_node.is_head else {"server_dest": plan.server_node.fabric_destination}
        ),
        **fabric_flags(plan.cluster),
        **kv_cache_flags(plan),
    }
    return StepSpec(
        name=names.check_of(names.memory_of(plan.slot)),
        node=plan.head,
        create=script_call(plan.head, "memory-check.sh", **flags),
        # One CUDA query per node (the image run once with the GPUs), bounded to 3 min each.
        timeouts=Timeouts(create=4 * len(plan.nodes) + 2),
    )


# The fleet's memory shares on the head, beside the scripts (<state>/front/shares): each memory
# check reads the servers after its own there. Read from the file, not from the check's command
# line: a model added or resized after a server re-runs nothing of that server.
SHARES_FILE_NAME = "shares"
SHARES_HEADER = "spark-vllm-shares"


def shares_file(plan: ClusterPlan) -> str:
    return f"{plan.head.state_dir}/front/{SHARES_FILE_NAME}"


def memory_shares(plan: ClusterPlan) -> str:
    """What memory-check.sh keeps free for the servers after the one it sizes: a header with
    what a server takes beside its fraction and the least share of an `auto` one, then every
    server in the fleet's order (the order their checks run in), a line each:
    `servedName|container|dest|share|host,host` (its container where it serves, read there to
    learn whether it runs and with what fraction; its gpuMemoryUtilization; its hosts)."""
    lines = [f"{SHARES_HEADER} {SERVER_OVERHEAD_SHARE} {MIN_AUTO_SHARE}\n"]
    for each in per_server(plan):
        node = each.server_node
        lines.append(
            f"{each.served.served_name}|{each.vllm_container}|"
            f"{'-' if node.is_head else node.fabric_destination}|"
            f"{each.served.settings.gpu_memory_utilization}|"
            + ",".join(n.name for n in each.nodes)
            + "\n"
        )
    return "".join(lines)


def kv_cache_flags(plan: ServerPlan) -> dict[str, str | int]:
    """What kv_sizing.py needs for vllm.kvCache (none when unset: vLLM's profiler sizes it)."""
    served = plan.served
    settings = served.settings
    if settings.kv_cache is None:
        return {}
    return {
        "kv_cache": str(settings.kv_cache),
        "snapshot": snapshot_dir(
            plan.config.model.cache_dir, served.id, plan.later(WEIGHTS_COMMIT).text
        ),
        "tensor_parallel": served.tensor_parallel_size,
        "pipeline_parallel": settings.pipeline_parallel_size,
        "max_model_len": settings.max_model_len or 0,
        "kv_cache_dtype": extra_arg_value(settings.extra_args, "--kv-cache-dtype") or "auto",
        "reserve_bytes": KV_CACHE_RESERVE_BYTES,
        # vLLM allocates whole blocks: extraArgs' --block-size, else the image's default (16,
        # 64 from vLLM 0.34), known from the head's image facts.
        "block_size": extra_arg_value(settings.extra_args, "--block-size")
        or plan.image_stream.later(KV_BLOCK_SIZE).text,
        # Only when set: a stack without them plans the check it planned before.
        **load_format_flag(settings.extra_args),
        **filter_flags(served),
    }


def load_format_flag(extra_args: Sequence[str]) -> dict[str, str]:
    """vllm.extraArgs' --load-format, which decides the files vLLM loads (vllm_weights.py)."""
    load_format = extra_arg_value(extra_args, "--load-format")
    return {"load_format": load_format} if load_format else {}


def snapshot_dir(cache_dir: str, model: str, commit: str) -> str:
    """Where the HF cache keeps a snapshot (huggingface_hub's layout; snapshot.sh reads it)."""
    return f"{cache_dir}/hub/models--{model.replace('/', '--')}/snapshots/{commit}"


def extra_arg_value(extra_args: Sequence[str], flag: str) -> str | None:
    """The value vllm.extraArgs gives `flag` (`--flag v` or `--flag=v`; the last one wins, as
    argparse reads it)."""
    value = None
    for index, arg in enumerate(extra_args):
        if arg == flag and index + 1 < len(extra_args):
            value = extra_args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.removeprefix(flag + "=")
    return value


def _last_json(stdout: str, prefix: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith(prefix)]
    return dict(json.loads(lines[-1].removeprefix(prefix))) if lines else {}


def parse_fabric_link(stdout: str) -> dict[str, Any]:
    """fabric-link.sh's figures: `gbps` (null when not measured), `mtu`, both speeds."""
    return _last_json(stdout, FABRIC_LINK_PREFIX)


def parse_memory_sizing(stdout: str) -> dict[str, Any]:
    """memory-check.sh's result: `gpuMemoryUtilization`, `mode`, and each node's figures."""
    return _last_json(stdout, MEMORY_SIZING_PREFIX)


def parse_preflight(stdout: str) -> dict[str, Any]:
    """preflight.sh's facts: its last line that is a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return {}


def hardware_warnings(facts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Warnings from every node's preflight facts: an allowed known-bad release, and nodes that
    run different kernels or drivers (NCCL and the driver's UVM behave per release)."""
    warnings = [
        f"{node}: {fact['knownBad']} (deployed anyway: preflight.allowKnownBad)"
        for node, fact in facts.items()
        if fact.get("knownBad")
    ]
    for key, what in (("kernel", "kernels"), ("nvidiaDriver", "NVIDIA drivers")):
        seen = {node: str(fact.get(key, "")) for node, fact in facts.items() if fact.get(key)}
        if len(set(seen.values())) > 1:
            listed = ", ".join(f"{node} {value}" for node, value in seen.items())
            warnings.append(f"the nodes run different {what} ({listed}): run one release on all")
    return warnings
