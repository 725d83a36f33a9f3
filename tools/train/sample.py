"""Generate text from an exported checkpoint with the PyTorch implementation.

    ../train-venv/bin/python tools/train/sample.py models/spark-shakespeare.npz \
        --prompt "ROMEO.\n" --tokens 120 --temperature 0.8 --top-k 40
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluate import generate  # noqa: E402
from spark_torch import SparkConfig, SparkModel  # noqa: E402


def load_model(path: Path):
    """(model, sentencepiece processor) from a SPEC section 5 .npz written by export.py."""
    import sentencepiece as spm

    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for entry in ("config", "tokenizer"):
        if entry not in arrays:
            sys.exit(f"sample: error: {path} has no '{entry}' entry")
    cfg = SparkConfig(**json.loads(str(arrays.pop("config")[()])))
    sp = spm.SentencePieceProcessor(model_proto=arrays.pop("tokenizer").tobytes())
    model = SparkModel(cfg)
    model.load_checkpoint_arrays(arrays)
    return model.eval(), sp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--prompt", default="ROMEO.\n")
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, sp = load_model(args.checkpoint)
    prompt = args.prompt.encode().decode("unicode_escape")
    print(generate(model, sp, prompt, args.tokens, args.temperature, args.top_k, args.seed))


if __name__ == "__main__":
    main()
