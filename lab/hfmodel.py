"""A tiny model in huggingface_hub's cache layout, seeded into the head's HF cache.

Layout written (what huggingface_hub itself produces):
    hub/models--spark-vllm-lab--tiny-chat/
        blobs/<git sha1 of small files | sha256 of LFS files>
        refs/main                       -> 40-hex commit id
        snapshots/<commit>/<file>       -> ../../blobs/<hash> (relative symlinks)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from pathlib import Path

from lab.spec import HF_MODEL, HF_MORE_MODELS, HF_REVISION

WEIGHTS_BYTES = 8 * 1024 * 1024
SEED = 20260601


def _config() -> bytes:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()


def _tokenizer() -> bytes:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, 512):
        vocab[f"t{i}"] = i
    tok = {
        "version": "1.0",
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "special": True,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
            }
            for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
        "post_processor": None,
        "decoder": None,
    }
    return (json.dumps(tok, sort_keys=True) + "\n").encode()


def _tokenizer_config() -> bytes:
    cfg = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
        "{% endfor %}assistant:",
    }
    return (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()


def _safetensors() -> bytes:
    """A valid safetensors file: one float32 tensor of random bytes (deterministic)."""
    count = WEIGHTS_BYTES // 4
    header = {
        "weights": {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]},
        "__metadata__": {"format": "pt"},
    }
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    data = random.Random(SEED).randbytes(count * 4)
    return struct.pack("<Q", len(head)) + head + data


def model_files(repo_id: str = HF_MODEL) -> dict[str, bytes]:
    name = repo_id.rsplit("/", 1)[-1]
    readme = f"# {name}\n\nRandom weights for the spark-vllm lab. Not a real model.\n"
    return {
        "config.json": _config(),
        "generation_config.json": b'{"bos_token_id": 1, "eos_token_id": 2}\n',
        "tokenizer.json": _tokenizer(),
        "tokenizer_config.json": _tokenizer_config(),
        "model.safetensors": _safetensors(),
        "README.md": readme.encode(),
    }


def blob_name(name: str, content: bytes) -> str:
    """LFS files are stored by sha256, regular git files by their git blob sha1."""
    if name.endswith(".safetensors"):
        return hashlib.sha256(content).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def commit_id(blobs: dict[str, str]) -> str:
    tree = "".join(f"{name} {blob}\n" for name, blob in sorted(blobs.items()))
    return hashlib.sha1(tree.encode()).hexdigest()


def real_model_files(model_dir: Path, repo_id: str) -> dict[str, bytes]:
    """The real tiny model the real-vLLM image's build wrote (lab/image/real_model.py), and a
    README naming `repo_id`, so each lab model has its own commit."""
    files = {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}
    name = repo_id.rsplit("/", 1)[-1]
    readme = f"# {name}\n\nRandom weights for the spark-vllm lab's real vLLM.\n"
    files["README.md"] = readme.encode()
    return files


def seed_cache(
    hf_home: Path,
    repo_id: str = HF_MODEL,
    revision: str = HF_REVISION,
    real_model: Path | None = None,
) -> str:
    """Write the model under hf_home/hub (the stand-in's, or with `real_model` the files the
    real image's build wrote there); return the commit id. Idempotent."""
    files = model_files(repo_id) if real_model is None else real_model_files(real_model, repo_id)
    blobs = {name: blob_name(name, content) for name, content in files.items()}
    commit = commit_id(blobs)
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for sub in (repo / "blobs", repo / "refs", snapshot):
        sub.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / blobs[name]
        if not blob.exists() or blob.stat().st_size != len(content):
            blob.write_bytes(content)
        link = snapshot / name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(f"../../blobs/{blobs[name]}", link)
    (repo / "refs" / revision).write_text(commit)  # no newline, as huggingface_hub writes it
    return commit


def seed_models(hf_home: Path, real_model: Path | None = None) -> None:
    """Every lab model (HF_MODEL, then HF_MORE_MODELS) in hf_home/hub. Idempotent."""
    for repo_id in (HF_MODEL, *HF_MORE_MODELS):
        seed_cache(hf_home, repo_id, real_model=real_model)
