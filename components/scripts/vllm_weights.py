"""Which files of a model snapshot vLLM loads as weights, so that what the memory check sizes is
what the server will hold (kv_sizing.py), not every file the repository carries (`original/`,
`metal/`, `*.gguf`, a consolidated copy beside the shards).

The rules are vLLM's DefaultModelLoader._prepare_weights
(vllm/model_executor/model_loader/default_loader.py) for a hub id served from the local cache
(HF_HUB_OFFLINE=1, as the program serves): the patterns of the load format are tried in order and
the first that matches a file at the snapshot's top wins (`glob.glob(os.path.join(hf_folder,
pattern))`: not recursive, no hidden names, a dangling link still listed); safetensors are then
kept only if `model.safetensors.index.json` names them (weight_utils.py
filter_duplicate_safetensors_files), other formats lose training state
(filter_files_not_needed_for_inference). tests/standin/test_conformance.py holds this to real
vLLM's own function on the same snapshots. Standard library only: it runs with the head's python3.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from pathlib import Path

# default_loader.py: the patterns per --load-format; `auto` is `hf` for a hub id offline (its
# mistral probe lists the repository's files through the Hub API, which offline mode refuses, and
# list_filtered_repo_files answers [] then), and `fall_back_to_pt` adds `*.pt` to every format
# that does not insist on safetensors.
PATTERNS_OF_FORMAT = {
    "auto": ("*.safetensors", "*.bin", "*.pt"),
    "hf": ("*.safetensors", "*.bin", "*.pt"),
    "safetensors": ("*.safetensors",),
    "fastsafetensors": ("*.safetensors",),
    "instanttensor": ("*.safetensors",),
    "mistral": ("consolidated*.safetensors",),
    "pt": ("*.pt",),
    "npcache": ("*.bin", "*.pt"),
}
# transformers.utils.SAFE_WEIGHTS_INDEX_NAME, and the mistral format's own index.
INDEX_OF_FORMAT = {"mistral": "consolidated.safetensors.index.json"}
SAFETENSORS_INDEX = "model.safetensors.index.json"
# weight_utils.py filter_files_not_needed_for_inference: names ending so are training state.
NOT_FOR_INFERENCE = (
    "training_args.bin",
    "optimizer.bin",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
)


def patterns_of(load_format: str) -> tuple[str, ...]:
    """The patterns vLLM tries for `load_format`; a format that reads no files of its own kind
    here (dummy, gguf, bitsandbytes, ...) is sized as `auto` would load it."""
    return PATTERNS_OF_FORMAT.get(load_format, PATTERNS_OF_FORMAT["auto"])


def loaded_weight_files(
    snapshot: Path,
    load_format: str = "auto",
    present: Callable[[str], bool] = lambda name: True,
) -> list[Path]:
    """The files vLLM loads from `snapshot`, in glob's order. `present(name)` says whether a file
    at the snapshot's top is there at all (a worker holds only what the model's include/exclude
    keep: weights_filter.kept)."""
    names = sorted(
        entry.name
        for entry in snapshot.iterdir()
        if not entry.name.startswith(".") and not entry.is_dir() and present(entry.name)
    )
    chosen: list[str] = []
    safetensors = False
    for pattern in patterns_of(load_format):
        chosen = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if chosen:
            safetensors = pattern.endswith(".safetensors")
            break
    if safetensors:
        index = INDEX_OF_FORMAT.get(load_format, SAFETENSORS_INDEX)
        if index in names and (snapshot / index).is_file():
            listed = set(json.loads((snapshot / index).read_text())["weight_map"].values())
            chosen = [name for name in chosen if name in listed]
    else:
        chosen = [name for name in chosen if not name.endswith(NOT_FOR_INFERENCE)]
    return [snapshot / name for name in chosen]
