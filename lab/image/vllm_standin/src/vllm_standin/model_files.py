"""Where the model lives on this node, and how much of it is really there.

Real vLLM (with HF_HUB_OFFLINE=1) reads the snapshot from the local HF cache on every worker;
a node with no snapshot, or with dangling symlinks (eugr #408: an rsync that "succeeded" with 0
weights), fails while loading weights. The stand-in checks exactly that, without loading anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SnapshotReport:
    model: str
    revision: str | None
    path: str | None
    file_count: int = 0
    total_bytes: int = 0
    dangling: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def usable(self) -> bool:
        return self.path is not None and self.file_count > 0 and not self.dangling

    def describe_problem(self) -> str:
        if self.path is None:
            return f"no local snapshot of {self.model}@{self.revision or 'main'}: {self.error}"
        if self.dangling:
            shown = ", ".join(self.dangling[:5])
            return f"snapshot {self.path} has {len(self.dangling)} dangling symlink(s): {shown}"
        if self.file_count == 0:
            return f"snapshot {self.path} holds no files"
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


def measure_snapshot(model: str, revision: str | None) -> SnapshotReport:
    try:
        path = locate_snapshot(model, revision)
    except Exception as error:  # any lookup failure means "not on this node"
        return SnapshotReport(model, revision, None, error=f"{type(error).__name__}: {error}")
    file_count = 0
    total_bytes = 0
    dangling: list[str] = []
    for directory, _, names in os.walk(path, followlinks=True):
        for name in sorted(names):
            full = os.path.join(directory, name)
            try:
                total_bytes += os.stat(full).st_size  # follows the snapshot -> blobs symlink
                file_count += 1
            except FileNotFoundError:
                dangling.append(os.path.relpath(full, path))
    return SnapshotReport(model, revision, path, file_count, total_bytes, tuple(dangling))


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
