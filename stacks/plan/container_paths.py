"""Paths inside every container of a node (the host side of each comes from the config)."""

CONTAINER_HF_HOME = "/root/.cache/huggingface"
CONTAINER_RAY_DIR = "/tmp/ray"
CONTAINER_API_KEY_DIR = "/run/spark-vllm"
CONTAINER_API_KEY_FILE = f"{CONTAINER_API_KEY_DIR}/api-key"
CONTAINER_SCRIPTS_DIR = "/spark-vllm/bin"  # the host's <stateDir>/bin, read-only: the probes
CONTAINER_COMPILE_CACHE = "/spark-vllm/cache"  # the host's <stateDir>/compile-cache
# vllm.hostNccl: the host's libnccl.so.2, read-only (stacks/plan/nccl.py)
CONTAINER_HOST_NCCL = "/spark-vllm/host-nccl/libnccl.so.2"
