"""What spark-vllm knows of `vllm serve`'s command line and environment: the flags and variables
it sets itself, those only one executor accepts, and how vLLM's parser reads a flag a user
writes. What a flag or variable opens to the network is stacks/vllm_listeners.py's table; the
rule that refuses them in `extraArgs` and `env` is stacks/config_rules.py's.
"""

from __future__ import annotations

import re

from stacks.vllm_listeners import LISTENER_FLAGS

# Environment keys spark-vllm derives per node (stacks/plan/arguments.py); env may not set them.
DERIVED_ENV_KEYS = frozenset(
    {
        "VLLM_HOST_IP",
        "RAY_ADDRESS",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
        "UCX_NET_DEVICES",
        "NCCL_IB_HCA",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "VLLM_API_KEY",
        "HF_TOKEN",
        "VLLM_PORT",
        "VLLM_ENGINE_READY_TIMEOUT_S",
    }
)
# vLLM's variables spark-vllm sets from a timeouts key (stacks/plan/arguments.py): env may not set
# them, and the refusal names the keys that do.
TIMEOUT_ENV_KEYS = {
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": (
        "timeouts.vllmExecuteColdSeconds (a start on an empty compile cache) and "
        "timeouts.vllmExecuteWarmSeconds (a start on a filled one)"
    ),
}
# The compile caches' locations (stacks/plan/arguments.py compile_cache_env): the node's bound
# cache directory; env may not move them back into the container.
COMPILE_CACHE_ENV_KEYS = frozenset(
    {
        "VLLM_CACHE_ROOT",
        "FLASHINFER_WORKSPACE_BASE",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "CUDA_CACHE_PATH",
    }
)
# vLLM flags the program sets itself; repeating them in extraArgs would be ambiguous or leak.
OWNED_VLLM_FLAGS = frozenset(
    {
        "--api-key",
        "--host",
        "--port",
        "--served-model-name",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--distributed-executor-backend",
        "--revision",
        "--max-model-len",
        "--gpu-memory-utilization",
        # executor mp (vllm/engine/arg_utils.py): set per node from hosts.
        "--nnodes",
        "-n",
        "--node-rank",
        "-r",
        "--master-addr",
        "--master-port",
        "--headless",
    }
)
# Flags only vLLM's multi-node mode without Ray accepts: vLLM refuses nnodes > 1 with Ray
# (vllm/config/parallel.py: "nnodes > 1 can only be set when distributed executor backend is mp").
MP_ONLY_FLAGS = frozenset({"--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port"})
# vLLM reads its arguments from this YAML file, where any owned flag could be set unchecked.
CONFIG_FILE_FLAG = "--config"
GUARDED_FLAGS = OWNED_VLLM_FLAGS | {CONFIG_FILE_FLAG}
LISTENER_FLAG_NAMES = frozenset(LISTENER_FLAGS)
# What kvCache sets (vllm/engine/arg_utils.py, 0.10.2 on): a user's own is kept when unset.
KV_CACHE_FLAGS = frozenset({"--kv-cache-memory-bytes"})


# vLLM's parser (FlexibleArgumentParser.parse_args in vllm/utils/argparse_utils.py; before that
# vllm/utils/__init__.py) folds `_` into `-` in a long option's name up to its first `.`
# (`--api_key` is `--api-key`) and reads `--name.key v` as `--name '{"key": v}'`. The rest is
# argparse (Python 3.11 tried; 3.12's Lib/argparse.py read): a long option's unambiguous prefix
# (`--api-k`), a multi-letter short option's prefix (`-t` for `-tp`; `-t=2` on 3.12), a short
# option's `=value` (`-tp=2`) and a one-letter one's attached value (`-n2`) all reach the option.
# A multi-letter one's attached value (`-tp2`) does not.
def flag_reached(arg: str, guarded: frozenset[str] = GUARDED_FLAGS) -> tuple[str, list[str]] | None:
    """The flag name `arg` is read as (folded) and the `guarded` flags it reaches; None for a
    value (no leading `-`, a negative number, `-`, or `--` which ends the options)."""
    if not arg.startswith("-") or arg in ("-", "--") or re.match(r"-\d", arg):
        return None
    if arg.startswith("--"):
        name = arg.split("=", 1)[0].split(".", 1)[0]
        name = "--" + name[2:].replace("_", "-")
        if len(name) <= 2:
            return name, []
    else:
        name = arg.split("=", 1)[0]
        if arg[:2] in guarded and len(name) > 2:  # a one-letter option's attached value
            return name, [arg[:2]]
    if name in guarded:
        return name, [name]
    return name, sorted(flag for flag in guarded if flag.startswith(name))


def reaches(arg: str, flags: frozenset[str]) -> list[str]:
    """Which of `flags` vLLM's parser reads `arg` as (none for a value)."""
    return (flag_reached(arg, flags) or ("", []))[1]
