"""Where the model lives on this node, and which of its weights are really there.

Real vLLM (with HF_HUB_OFFLINE=1) reads the snapshot from the local HF cache on every worker, and
of it only the weights its loader picks (vllm/model_executor/model_loader/default_loader.py
DefaultModelLoader._prepare_weights): a node with no snapshot, or whose weights are dangling
symlinks (eugr #408: an rsync that "succeeded" with 0 weights), fails while loading them; files
it does not load (`original/`, a `.gguf`, a README) may differ from node to node. The stand-in
checks exactly that, without loading anything (tests/standin/test_conformance.py holds the
choice of files to real vLLM's).
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field

# _prepare_weights for a hub id offline (`--load-format auto` is `hf` then): the first pattern
# that matches a name at the snapshot's top (glob.glob: not recursive, no hidden names) wins.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
# weight_utils.py filter_duplicate_safetensors_files: safetensors the index names, if it has one.
SAFETENSORS_INDEX = "model.safetensors.index.json"
# weight_utils.py filter_files_not_needed_for_inference.
TRAINING_STATE = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")


@dataclass(frozen=True)
class SnapshotReport:
    model: str
    revision: str | None
    path: str | None
    weights: tuple[tuple[str, int], ...] = ()  # (name, bytes) of each file vLLM loads
    dangling: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def file_count(self) -> int:
        return len(self.weights)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.weights)

    @property
    def usable(self) -> bool:
        return self.path is not None and bool(self.weights) and not self.dangling

    def describe_problem(self) -> str:
        if self.path is None:
            return f"no local snapshot of {self.model}@{self.revision or 'main'}: {self.error}"
        if self.dangling:
            shown = ", ".join(self.dangling[:5])
            return f"snapshot {self.path} has {len(self.dangling)} dangling symlink(s): {shown}"
        if not self.weights:
            return (
                f"snapshot {self.path} holds no weights vLLM loads ({', '.join(WEIGHT_PATTERNS)})"
            )
        return "ok"


def locate_snapshot(model: str, revision: str | None) -> str:
    """A local directory is used as is; a hub id is looked up in the local HF cache only."""
    if os.path.isdir(model):
        return os.path.abspath(model)
    # Imported here: huggingface_hub reads HF_HOME / HF_HUB_OFFLINE from the environment at
    # import time, and a Ray worker process must see its own node's values.
    from huggingface_hub import snapshot_download

    path = snapshot_download(model, revision=revision, local_files_only=True)
    return str(path)


def loaded_weight_names(path: str) -> list[str]:
    """The files of the snapshot at `path` that vLLM loads as weights, in glob's order."""
    names = sorted(
        name
        for name in os.listdir(path)
        if not name.startswith(".") and not os.path.isdir(os.path.join(path, name))
    )
    for pattern in WEIGHT_PATTERNS:
        chosen = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if chosen:
            break
    else:
        return []
    if pattern != "*.safetensors":
        return [name for name in chosen if not name.endswith(TRAINING_STATE)]
    index = os.path.join(path, SAFETENSORS_INDEX)
    if not os.path.isfile(index):
        return chosen
    with open(index, encoding="utf-8") as handle:
        listed = set(json.load(handle)["weight_map"].values())
    return [name for name in chosen if name in listed]


def measure_snapshot(model: str, revision: str | None) -> SnapshotReport:
    try:
        path = locate_snapshot(model, revision)
        names = loaded_weight_names(path)
    except Exception as error:  # any lookup failure means "not on this node"
        return SnapshotReport(model, revision, None, error=f"{type(error).__name__}: {error}")
    weights: list[tuple[str, int]] = []
    dangling: list[str] = []
    for name in names:
        try:
            weights.append((name, os.stat(os.path.join(path, name)).st_size))  # through the link
        except FileNotFoundError:
            dangling.append(name)
    return SnapshotReport(model, revision, path, tuple(weights), tuple(dangling))


def read_max_position_embeddings(snapshot_path: str) -> int | None:
    """The model's own context limit from config.json, when the snapshot has one."""
    import json

    try:
        with open(os.path.join(snapshot_path, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def kv_bytes_per_token(snapshot_path: str, tensor_parallel_size: int) -> int:
    """One token in one rank's KV cache (vLLM's full-attention page per token): K and V, the
    rank's share of the KV heads (at least one), every layer, the model's dtype."""
    import json

    with open(os.path.join(snapshot_path, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    heads = int(config.get("num_attention_heads", 1))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    dtype_bytes = 4 if config.get("torch_dtype") == "float32" else 2
    layers = int(config["num_hidden_layers"])
    return 2 * layers * max(kv_heads // tensor_parallel_size, 1) * head_dim * dtype_bytes
