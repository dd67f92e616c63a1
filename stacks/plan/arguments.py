"""What each process of a server starts with: its environment on every node, `ray start`'s
arguments, the launcher's and `vllm serve`'s. Every per-node variable is derived here, the one
place the field's pitfalls about wrong NICs, Gloo on loopback and env not reaching a worker are
handled (../shared/ANCHORS.md)."""

from __future__ import annotations

from dataclasses import dataclass

from stacks.config import MAX_VLLM_READY_SECONDS, TimeoutsConfig
from stacks.plan.cluster import ClusterPlan, NodePlan
from stacks.plan.container_paths import (
    CONTAINER_API_KEY_FILE,
    CONTAINER_COMPILE_CACHE,
    CONTAINER_HF_HOME,
    CONTAINER_SCRIPTS_DIR,
)
from stacks.plan.nccl import host_nccl_env
from stacks.plan.server_plan import ServerPlan
from stacks.plan.sizing import ServerSizing


def node_env(plan: ServerPlan, node: NodePlan) -> dict[str, str]:
    """The environment of every Ray/vLLM process on `node`: NICs, IPs and the offline HF cache.

    Not set, because nothing reads it: RAY_NODE_IP_ADDRESS (absent from Ray 2.60's wheel, Python
    and binaries alike; `ray start --node-ip-address` sets each node's IP).
    """
    env = dict(plan.served.settings.env)
    env.update(
        {
            # vLLM's own IP for the driver and each rank (vllm/envs.py VLLM_HOST_IP).
            "VLLM_HOST_IP": node.fabric_ip,
            "NCCL_SOCKET_IFNAME": node.fabric_interface,
            "GLOO_SOCKET_IFNAME": node.fabric_interface,
            "TP_SOCKET_IFNAME": node.fabric_interface,
            "UCX_NET_DEVICES": node.fabric_interface,
            "HF_HOME": CONTAINER_HF_HOME,
            "HF_HUB_OFFLINE": "1",
            # The HF cache is mounted read-only (containers.py): the one thing a server writes
            # under HF_HOME, a model's own code (trust_remote_code: transformers'
            # dynamic_module_utils), goes to the node's writable cache instead.
            "HF_MODULES_CACHE": f"{CONTAINER_COMPILE_CACHE}/hf-modules",
        }
    )
    env.update(compile_cache_env())
    env.update(host_nccl_env(node))  # vllm.hostNccl only
    # vLLM's own wait for its engine core (vllm/envs.py, 0.14.0 on; 600 s by default): never
    # shorter than ours, whatever timeouts.vllmReadySeconds is (its ceiling: a constant, so a
    # change of our wait replaces no container). It bounds the API server's handshake with the
    # engine core (v1/engine/core_client.py MPClient), not the model load, which with one API
    # server only our readiness wait bounds (docs/design.md, "vLLM's own time limits").
    env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(MAX_VLLM_READY_SECONDS)
    if node.rdma_hcas:
        env["NCCL_IB_HCA"] = ",".join(node.rdma_hcas)
        env.setdefault("NCCL_IB_DISABLE", "0")
        # Which transport NCCL chose is logged at communicator init (its INIT and NET
        # subsystems print there, not per collective): the readiness wait reads it from the
        # server's log and warns when RDMA was expected but sockets were used.
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    # Where vLLM's own ports start on this node (its message queues; with executor ray also the
    # driver's TCPStore): vllm.masterPort + 1 on, a range the firewall covers (MP_PORT_SPAN).
    env["VLLM_PORT"] = str(plan.master_port + 1)
    if not plan.uses_ray:
        return env
    # A driver must join the cluster, never start a private local Ray.
    env["RAY_ADDRESS"] = plan.cluster.ray_address
    # Ray's memory monitor kills tasks and actors above its host-memory threshold; on GB10 the
    # GPU's allocations (weights, KV cache) come out of the same unified memory, so the vLLM
    # ranks are its likely victims. The raylet reads this at start ("To disable worker killing,
    # set RAY_memory_monitor_refresh_ms to zero", Ray 2.60); both two-Spark references set it
    # (NVIDIA dgx-spark-playbooks nvidia/vllm, eugr/spark-vllm-docker). vllm.env may override.
    env.setdefault("RAY_memory_monitor_refresh_ms", "0")
    return env


def compile_cache_env() -> dict[str, str]:
    """Every compile cache a vLLM rank fills, in the node's bound cache directory instead of
    the container's home and /tmp, which a replacement loses. Each variable and its default:
    - VLLM_CACHE_ROOT (vllm/envs.py; ~/.cache/vllm): torch.compile artifacts under
      torch_compile_cache/<hash of the config and vLLM's version>; while compiling vLLM points
      Inductor's and Triton's caches inside it too (vllm/compilation/compiler_interface.py);
    - FLASHINFER_WORKSPACE_BASE (flashinfer/jit/env.py; the home directory): JIT kernels under
      <base>/.cache/flashinfer, compiled for the GPU (sm_121 on GB10) at first use;
    - TRITON_CACHE_DIR (triton knobs; ~/.triton/cache) and TORCHINDUCTOR_CACHE_DIR
      (torch/_inductor/runtime/cache_dir_utils.py; /tmp/torchinductor_<user>): kernels compiled
      outside vLLM's own compile step;
    - CUDA_CACHE_PATH (CUDA programming guide, environment variables; ~/.nv/ComputeCache): the
      driver's JIT cache of PTX compiled for this GPU."""
    cache = CONTAINER_COMPILE_CACHE
    return {
        "VLLM_CACHE_ROOT": f"{cache}/vllm",
        "FLASHINFER_WORKSPACE_BASE": cache,
        "TRITON_CACHE_DIR": f"{cache}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
        "CUDA_CACHE_PATH": f"{cache}/nv-compute",
    }


@dataclass(frozen=True)
class ExecuteTimeouts:
    """vLLM's limit on one step of the model (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, vllm/envs.py:
    300 s; the executor's wait for each execute_model call), for a start on an empty compile
    cache and on a filled one. The launcher picks one at each start (vllm-launcher.sh
    --execute-seconds-cold/-warm): both are in the container's command, so the container is
    the same whichever a start needs and a cold start never replaces it."""

    cold: int
    warm: int


def execute_timeouts(timeouts: TimeoutsConfig) -> ExecuteTimeouts:
    """From timeouts.vllmExecuteColdSeconds and vllmExecuteWarmSeconds (defaults 1800 and 600:
    stacks/schema.py). Why 1800 for a cold start on a Spark: the first requests compile what the
    cache lacks inside a step (FlashInfer's JIT kernels for sm_121, Triton's autotuning, the
    CUDA graphs of each batch size), on 20 ARM cores, where vLLM's 300 s ends the engine with
    EngineDeadError; and a step longer than 1800 s buys nothing on two or more nodes, where
    torch.distributed's collectives (30 min by default, the gloo barrier of a TP start) give up
    then anyway. Warm (600): twice vLLM's default, for a kernel the cache still lacks (a batch
    shape no earlier start served). A warm value above the cold one is refused by the schema;
    it is kept at most the cold one here too, whatever built the config."""
    cold = timeouts.vllm_execute_cold_seconds
    return ExecuteTimeouts(cold=cold, warm=min(timeouts.vllm_execute_warm_seconds, cold))


def ray_start_args(plan: ClusterPlan, node: NodePlan) -> list[str]:
    """`ray start` arguments; `--block` keeps Ray the container's main process."""
    ray = plan.config.ray
    common = [
        "--block",
        f"--node-ip-address={node.fabric_ip}",
        f"--num-gpus={node.gpus}",
        f"--object-store-memory={ray.object_store_memory_bytes}",
        "--disable-usage-stats",
        *(f"{flag}={port}" for flag, port in ray.node_port_flags.items()),
        f"--min-worker-port={ray.min_worker_port}",
        f"--max-worker-port={ray.max_worker_port}",
    ]
    if node.is_head:
        return [
            "start",
            "--head",
            f"--port={ray.port}",
            "--include-dashboard=false",
            *common,
        ]
    return ["start", f"--address={plan.ray_address}", *common]


# The Ray watch (components/scripts/ray_watch.py; docs/design.md, "The Ray watch"): it acts when
# this node's raylet has run GRACE seconds (a raylet registers within a few) and then
# ABSENT_CHECKS checks in a row, INTERVAL apart, each bounded by CHECK, found the head's GCS
# answering without it: about two minutes after a head's restart left it unregistered. A GCS
# that does not answer is left to Ray's own limit (gcs_rpc_server_reconnect_timeout_s, 60 s).
RAY_WATCH_SCRIPT = "ray_watch.py"
RAY_WATCH_GRACE_S = 60
RAY_WATCH_INTERVAL_S = 15
RAY_WATCH_CHECK_S = 10
RAY_WATCH_ABSENT_CHECKS = 4


def ray_watch_entrypoint(plan: ClusterPlan, node: NodePlan) -> list[str]:
    """The watch (from the mounted scripts, with the image's python3, the one Ray runs on),
    then `ray`: `ray_start_args` stay the container's command."""
    return [
        "python3",
        f"{CONTAINER_SCRIPTS_DIR}/{RAY_WATCH_SCRIPT}",
        f"--gcs={plan.ray_address}",
        f"--node-ip={node.fabric_ip}",
        f"--grace-seconds={RAY_WATCH_GRACE_S}",
        f"--interval-seconds={RAY_WATCH_INTERVAL_S}",
        f"--check-seconds={RAY_WATCH_CHECK_S}",
        f"--absent-checks={RAY_WATCH_ABSENT_CHECKS}",
        "--",
        "ray",
    ]


def vllm_launcher_args(
    plan: ServerPlan, sizing: ServerSizing, node: NodePlan | None = None
) -> list[str]:
    """The launcher's flags (components/scripts/vllm-launcher.sh), then `--` and vLLM's, for
    the server on the head or, with executor mp, a headless `node`.

    `--expect-ips` lists every node with either executor: the memory check reads it from the
    running server to know where that server's memory is given back on a restart.
    """
    node = node or plan.server_node
    flags = [
        "--executor",
        plan.served.settings.executor,
        "--expect-ips",
        ",".join(n.fabric_ip for n in plan.nodes),
        "--gpus",
        str(plan.total_gpus),
        "--wait-seconds",
        str(plan.config.timeouts.ray_join_seconds),
        "--scripts",
        CONTAINER_SCRIPTS_DIR,
        *execute_timeout_flags(plan.config.timeouts),
    ]
    if plan.runs_server(node):
        flags += ["--key-file", CONTAINER_API_KEY_FILE]
    if not plan.uses_ray:
        peers = plan.ranks[1:] if plan.runs_server(node) else (plan.server_node,)
        flags += [
            "--rendezvous",
            plan.rendezvous,
            "--peers",
            ",".join(f"{p.name}={p.fabric_ip}" for p in peers),
        ]
    if plan.runs_server(node):
        # mp: the supervisor's readiness; either executor: the launcher's ready marker.
        flags += ["--health-url", f"http://{plan.server_address}:{plan.server_port}/health"]
    return [*flags, "--", *vllm_serve_args(plan, sizing, node)]


def execute_timeout_flags(timeouts: TimeoutsConfig) -> list[str]:
    """The launcher's choice of vLLM's execute timeout: by whether this node's compile cache
    (compile_cache_env) holds a file when it starts."""
    chosen = execute_timeouts(timeouts)
    return [
        "--compile-cache",
        CONTAINER_COMPILE_CACHE,
        "--execute-seconds-cold",
        str(chosen.cold),
        "--execute-seconds-warm",
        str(chosen.warm),
    ]


def vllm_serve_args(
    plan: ServerPlan, sizing: ServerSizing, node: NodePlan | None = None
) -> list[str]:
    """Arguments after `vllm serve` on `node` (the head by default), from typed config (never
    probed from the image) and, with `auto`, the sizing the memory check derived. With executor
    mp every node gets the same arguments but its node rank, and the workers `--headless` (vLLM
    docs, parallelism_scaling.md)."""
    served = plan.served
    settings = served.settings
    node = node or plan.server_node
    args = [
        served.id,
        "--served-model-name",
        served.served_name,
        "--revision",
        served.revision,
        "--host",
        plan.server_address,
        "--port",
        str(plan.server_port),
        "--tensor-parallel-size",
        str(served.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(settings.pipeline_parallel_size),
        "--distributed-executor-backend",
        settings.executor,
        *sizing.flags(),
    ]
    if not plan.uses_ray:
        args += [
            "--nnodes",
            str(len(plan.nodes)),
            "--node-rank",
            str(plan.node_rank(node)),
            "--master-addr",
            plan.server_node.fabric_ip,
            "--master-port",
            str(plan.master_port),
        ]
        if not plan.runs_server(node):
            args.append("--headless")
    if settings.max_model_len is not None:
        args += ["--max-model-len", str(settings.max_model_len)]
    return args + list(settings.extra_args)
