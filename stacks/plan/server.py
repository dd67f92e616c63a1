"""Ray and the server's waits, as pure specs (stacks/plan/steps.py): every node joined, the API
key's file, and the readiness wait (with the NCCL transport it found)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from stacks.plan import names
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.container_paths import CONTAINER_API_KEY_FILE, CONTAINER_SCRIPTS_DIR
from stacks.plan.fabric import fabric_flags
from stacks.plan.front import (
    BEARER_FILE_NAME,
    HANDOVER_CERT_NAME,
    subject_alt_name,
)
from stacks.plan.hardware import extra_arg_value
from stacks.plan.hosts import keys_map_file, tls_file
from stacks.plan.server_plan import ServerPlan, log_specs, node_check_specs
from stacks.plan.steps import Stdin, StepSpec, Timeouts, check, script_call, undoable


def ray_wait(plan: ServerPlan) -> StepSpec:
    """Every node joined Ray over its fabric IP with its GPUs, within the join timeout."""
    seconds = plan.config.timeouts.ray_join_seconds
    awaited: dict[str, str | float] = {
        "expect_ips": ",".join(n.fabric_ip for n in plan.nodes),
        "gpus": plan.total_gpus,
        "timeout_seconds": seconds,
    }
    return _wait(plan, names.RAY_JOINED, "ray-wait.sh", "ray-head", awaited, seconds)


def _wait(
    plan: ServerPlan,
    step: str,
    script: str,
    container: Literal["ray-head", "vllm"],
    awaited: dict[str, str | float],
    seconds: int,
    model: dict[str, str] | None = None,
    stdin: Stdin | None = None,
) -> StepSpec:
    """A bounded wait on the head for `container`; on a timeout, its diagnostics: every node's
    log (the server's too once it runs) and its image, weights and memory checks. A server on
    a worker is awaited there, its diagnostics that node's own (only the head holds the
    fabric key that reaches the others)."""
    node = plan.server_node if container == "vllm" else plan.head
    reach: dict[str, str] = {}
    if node.is_head:
        nodes, checks = log_specs(plan, include_vllm=container == "vllm"), node_check_specs(plan)
        reach = fabric_flags(plan.cluster)
    else:
        nodes = f"{node.name}|-|{plan.vllm_container}"
        checks = f"{node.name}|-|{node.bin_dir}"
    flags: dict[str, str | float] = {
        "container": plan.vllm_container
        if container == "vllm"
        else plan.cluster.container_name(container),
        "container_scripts": CONTAINER_SCRIPTS_DIR,
        **awaited,
        "nodes": nodes,
        "node_checks": checks,
        "image": plan.pinned_image.text,
        **(model or {}),
        **reach,
    }
    return StepSpec(
        name=step,
        node=node,
        create=script_call(node, script, **flags),
        stdin=stdin,
        timeouts=Timeouts(create=seconds // 60 + 5),
    )


def front_key_file(plan: ClusterPlan) -> StepSpec:
    """The API key on the head, where the servers there read it, alone in its directory; the
    front's pattern file (`Bearer <key>`) in the front's own secrets."""
    bearer = f"{plan.front_secrets_dir}/{BEARER_FILE_NAME}"
    return _key_file(plan, names.FRONT_KEY_FILE, plan.head, plan.api_key_file, bearer=bearer)


def front_keys_file(plan: ClusterPlan) -> StepSpec | None:
    """The named keys' map (`keys`, stdin) beside the API key on the head, where the front
    reads it; none without `keys`. A step of its own: a key added, changed or revoked touches
    no other key's file, and no server (the servers read only the API key)."""
    if not plan.config.keys:
        return None
    head = plan.head
    file = keys_map_file(plan)
    return undoable(
        plan,
        names.FRONT_KEYS,
        head,
        "front-keys-file.sh",
        ("write", "remove"),
        {"file": file},
        # The handover's key pair, made beside the maps when missing (front-keys-file.sh).
        (check("files", file, f"{plan.front_secrets_dir}/{HANDOVER_CERT_NAME}"),),
        stdin="user-keys",
        quiet="none",
    )


def front_tls_file(plan: ClusterPlan) -> StepSpec | None:
    """front.tls: the front's certificate and key in its secrets on the head, the user's (stdin,
    nothing logged) or a self-signed pair the head makes for the endpoint's address; the
    certificate printed for the outputs (front.first_certificate). None with TLS off."""
    tls = plan.config.front.tls
    if not tls.enabled:
        return None
    file = tls_file(plan)
    return undoable(
        plan,
        names.FRONT_TLS,
        plan.head,
        "front-tls-file.sh",
        ("write", "remove"),
        {"file": file},
        (check("files", file),),
        create_flags={"san": subject_alt_name(plan.endpoint_host)} if tls.self_signed else None,
        stdin="front-tls" if tls.user_certificate else None,
        quiet="none" if tls.user_certificate else None,
    )


def server_key_file(plan: ServerPlan) -> StepSpec:
    """The API key where a server on a worker runs (`server_key_dir`): its launcher reads it."""
    node = plan.server_node
    step = names.server_key_of(names.vllm_of(plan.slot))
    return _key_file(plan.cluster, step, node, f"{plan.server_key_dir}/api-key")


def _key_file(
    plan: ClusterPlan,
    name: str,
    node: NodePlan,
    file: str,
    bearer: str | None = None,
) -> StepSpec:
    """The API key (stdin) written to `file` on `node`, and with `bearer` the front's pattern
    file there; nothing is logged."""
    flags = {"file": file, **({"bearer": bearer} if bearer is not None else {})}
    return undoable(
        plan,
        name,
        node,
        "api-key-file.sh",
        ("write", "remove"),
        flags,
        (check("files", *flags.values()),),
        stdin="api-key",
        quiet="none",
    )


BENCHMARK_PREFIX = "benchmark: "  # bench_summary.py's lines


def vllm_benchmark(plan: ServerPlan) -> StepSpec | None:
    """vllm.benchmark: `vllm bench serve` in the server's container on the head, against vLLM's
    own port, at each concurrency (vllm-bench.sh). None when not asked for."""
    wanted = plan.config.vllm.benchmark
    if wanted is None:
        return None
    served = plan.served
    flags: dict[str, str | float] = {
        "container": plan.vllm_container,
        "key_file": CONTAINER_API_KEY_FILE,
        "port": plan.server_port,
        "served_name": served.served_name,
        "model": served.id,
        "revision": served.revision,
        "concurrencies": ",".join(str(c) for c in wanted.concurrencies),
        "input_tokens": wanted.input_tokens,
        "output_tokens": wanted.output_tokens,
        "requests_per_stream": wanted.requests_per_stream,
        "timeout_seconds": wanted.timeout_minutes * 60,
        # The tokenizer loads as the server's does (vLLM's bench serve has both flags).
        "trust_remote_code": "yes" if trusts_remote_code(served.settings.extra_args) else "no",
        "tokenizer_mode": extra_arg_value(served.settings.extra_args, "--tokenizer-mode") or "",
    }
    if not plan.server_node.is_head:  # a server on a worker listens on its fabric IP
        flags["server_host"] = plan.server_address
    node = plan.server_node
    return StepSpec(
        name=names.benchmark_of(names.vllm_of(plan.slot)),
        node=node,
        create=script_call(node, "vllm-bench.sh", **flags),
        timeouts=Timeouts(create=wanted.timeout_minutes + 2),
    )


def trusts_remote_code(extra_args: Sequence[str]) -> bool:
    """vLLM's --trust-remote-code (a BooleanOptionalAction: the last of it and its --no- form
    wins)."""
    trusted = False
    for arg in extra_args:
        if arg in ("--trust-remote-code", "--no-trust-remote-code"):
            trusted = arg == "--trust-remote-code"
    return trusted


def parse_benchmark(stdout: str) -> list[dict[str, Any]]:
    """vllm-bench.sh's result: one `benchmark: {...}` line per concurrency."""
    return [
        json.loads(line.removeprefix(BENCHMARK_PREFIX))
        for line in stdout.splitlines()
        if line.startswith(BENCHMARK_PREFIX)
    ]


def front_probe_host(plan: ClusterPlan) -> dict[str, str]:
    """Where the readiness probe reaches the front (none: 127.0.0.1), as `https://ADDRESS` with
    front.tls: an address of the head itself, so the probe does not check the certificate
    (vllm_probe.py; docs/design.md, The front's TLS)."""
    if plan.config.front.tls.enabled:
        return {"probe_host": f"https://{plan.probe_address}"}
    return {} if plan.config.vllm.listen == "all" else {"probe_host": plan.probe_address}


def vllm_ready(plan: ServerPlan) -> StepSpec:
    """The served model answers a real completion (the API key on stdin), within the timeout."""
    cfg = plan.config
    seconds = cfg.timeouts.vllm_ready_seconds
    # Through the front, as a client: the whole route, the key included. A server on a
    # worker is probed there, directly (with the key: vLLM checks it on /v1).
    through_front = plan.server_node.is_head
    probe: dict[str, str | float] = (
        {"port": cfg.vllm.port, **front_probe_host(plan.cluster)}
        if through_front
        else {"port": plan.server_port, "probe_host": plan.server_address}
    )
    awaited: dict[str, str | float] = {
        **probe,
        "served_name": plan.served.served_name,
        "timeout_seconds": seconds,
        "progress_seconds": cfg.timeouts.vllm_progress_seconds,
        "measure_completions": plan.served.settings.measure_completions,
        # With HCAs, NCCL should run over RoCE: the wait reads which transport it chose.
        "expect_transport": "ib" if plan.expects_rdma else "none",
        "executor": plan.served.settings.executor,
        # mp: where the nodes meet; the diagnostics check each node's way there.
        **({} if plan.uses_ray or not through_front else {"rendezvous": plan.rendezvous}),
        # The cold-start figures: when the server's own port opens (stacks/plan/cold_start.py).
        "server_address": plan.server_address,
        "server_port": plan.server_port,
        # memoryGuard: a node's guard that stopped this server's container there is the cause.
        **(
            {"guard_container": plan.cluster.container_name("memory-guard")}
            if plan.cluster.guards_memory
            else {}
        ),
    }
    served = plan.served
    snapshot = {"model": served.id, "revision": served.revision, "cache_dir": cfg.model.cache_dir}
    step, script = names.ready_of(names.vllm_of(plan.slot)), "vllm-ready.sh"
    return _wait(plan, step, script, "vllm", awaited, seconds, snapshot, "api-key")


FABRIC_TRANSPORT_PREFIX = "fabric transport: "


def parse_fabric_transport(readiness: str) -> str:
    """vllm-ready.sh's `fabric transport:` line: `ib <devices>`, `socket <interfaces>`, another
    NCCL network, `unknown`, or `not checked (...)`."""
    lines = [line for line in readiness.splitlines() if line.startswith(FABRIC_TRANSPORT_PREFIX)]
    return lines[-1].removeprefix(FABRIC_TRANSPORT_PREFIX).strip() if lines else "unknown"


SPEED = re.compile(r"speed: time to first token ([\d.]+) s, decode ([\d.]+) tokens/s")


def parse_readiness(readiness: str) -> dict[str, Any]:
    """The readiness wait's measured time to first token and decode speed (None when not
    measured). The output exists only once the wait saw the server ready."""
    speed = SPEED.search(readiness)
    return {
        "timeToFirstTokenSeconds": float(speed[1]) if speed else None,
        "tokensPerSecond": float(speed[2]) if speed else None,
    }


def model_output(plan: ServerPlan, readiness: str, sizing: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of the `models` output: the plan's server, what it is, where it runs, and what
    it showed once ready; its memory share is the fraction its memory check settled on with
    `auto`."""
    served = plan.served
    share = served.settings.gpu_memory_utilization
    if share == "auto":
        share = sizing.get("gpuMemoryUtilization", "auto")
    return {
        "servedName": served.served_name,
        "id": served.id,
        "revision": served.revision,
        "nodes": list(served.hosts),
        "executor": served.settings.executor,
        "image": served.image.ref,
        "gpuMemoryUtilization": share,
        **parse_readiness(readiness),
    }
