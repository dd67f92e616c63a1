"""Snapshots shaped as model repos ship them, and the files real vLLM loads from each: one table
for the memory check's sizing (components/scripts/vllm_weights.py, tests/program), the stand-in's
check of every rank's weights (lab/image/vllm_standin model_files.py) and real vLLM's own
DefaultModelLoader._prepare_weights (tests/standin/test_conformance.py), so all three are held
to the same answers."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

MODEL = "spark-lab/weights-shapes"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}


@dataclass(frozen=True)
class Shape:
    """A snapshot: its files (path -> bytes), the names its safetensors index lists (none: no
    index), the --load-format, and what vLLM loads of it (names at the snapshot's top)."""

    name: str
    files: dict[str, int]
    loaded: tuple[str, ...]
    index: tuple[str, ...] | None = None
    load_format: str = "auto"


SHAPES = (
    Shape("one safetensors file", {"model.safetensors": 300}, ("model.safetensors",)),
    Shape(
        "shards, and what repos carry beside them (original/, metal/, a gguf)",
        {
            "model-00001-of-00002.safetensors": 200,
            "model-00002-of-00002.safetensors": 100,
            "original/consolidated.safetensors": 300,
            "metal/model.safetensors": 300,
            "model.gguf": 150,
        },
        ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
    ),
    Shape(
        "a consolidated copy beside the shards: the index decides (Mistral-7B-Instruct-v0.3)",
        {
            "model-00001-of-00002.safetensors": 200,
            "model-00002-of-00002.safetensors": 100,
            "consolidated.safetensors": 300,
        },
        ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
        index=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
    ),
    Shape(
        "safetensors win over PyTorch bins",
        {"model.safetensors": 300, "pytorch_model.bin": 310},
        ("model.safetensors",),
    ),
    Shape(
        "bins without training state",
        {"pytorch_model.bin": 310, "training_args.bin": 5, "optimizer.pt": 40},
        ("pytorch_model.bin",),
    ),
    Shape("a .pt checkpoint", {"model.pt": 320}, ("model.pt",)),
    Shape(
        "--load-format pt takes the .pt beside safetensors",
        {"model.safetensors": 300, "model.pt": 320},
        ("model.pt",),
        load_format="pt",
    ),
    Shape(
        "weights only below the top: none loaded",
        {"original/model.safetensors": 300},
        (),
    ),
)


def link_to_blob(root: Path, snapshot: Path, name: str, content: bytes) -> None:
    """`name` in `snapshot` as the hub client writes it: a relative link into blobs/."""
    blob = hashlib.sha256(content).hexdigest()
    (root / "blobs" / blob).write_bytes(content)
    link = snapshot / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path(*[".."] * (2 + name.count("/")), "blobs", blob))


def write_snapshot(hf_home: Path, shape: Shape, model: str = MODEL) -> Path:
    """`shape` in huggingface_hub's cache layout under `hf_home` (blobs/, refs/main,
    snapshots/<commit>), config.json and tokenizer beside its weights; the snapshot's path."""
    root = hf_home / "hub" / f"models--{model.replace('/', '--')}"
    commit = hashlib.sha1(repr(shape).encode()).hexdigest()
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    snapshot.mkdir(parents=True)
    files = {"config.json": json.dumps(CONFIG).encode(), "tokenizer.json": b"{}"}
    files |= {name: name.encode().ljust(size, b".") for name, size in shape.files.items()}
    if shape.index is not None:
        weight_map = {f"layer.{i}.weight": name for i, name in enumerate(shape.index)}
        files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    for name, content in files.items():
        link_to_blob(root, snapshot, name, content)
    (root / "refs" / "main").write_text(commit)
    return snapshot


def loaded_bytes(shape: Shape) -> int:
    return sum(shape.files[name] for name in shape.loaded)
