"""Runs inside the serving image (its own python3, with the GPUs): what CUDA reports free and in
all on device 0, which is what vLLM compares `--gpu-memory-utilization` with at start-up
(vllm/v1/worker/gpu_worker.py: the start-up snapshot's free memory must cover utilization x
total). Prints `cuda FREE TOTAL` in bytes; exits 3 when the image has no torch or sees no GPU.
Mounted alone into the container (memory-probe.sh): it imports nothing of ours (no hostlib.py).
"""

from __future__ import annotations

import sys

try:
    import torch
except ImportError:
    print("problem: the image has no torch", file=sys.stderr)
    sys.exit(3)

if not torch.cuda.is_available():
    print("problem: torch sees no CUDA device", file=sys.stderr)
    sys.exit(3)
free, total = torch.cuda.mem_get_info(0)
print(f"cuda {free} {total}")
