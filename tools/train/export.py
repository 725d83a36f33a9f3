"""Write the SPEC section 5 checkpoint (.npz, float32) and its evaluation JSON.

As a script it re-exports from a training state file:

    python tools/train/export.py --state tools/train/work/state.pt \
        --tokenizer tools/train/work/tokenizer.model --heldout models/heldout.txt \
        --out models/spark-shakespeare.npz
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

SLICE_CHUNKS = 8


def write_checkpoint(model, tokenizer_bytes: bytes, path: Path) -> None:
    """Save arrays + `config` (0-d unicode JSON) + `tokenizer` (uint8) atomically to path."""
    arrays = model.checkpoint_arrays()
    arrays["config"] = np.array(json.dumps(model.cfg.to_json_dict()))
    arrays["tokenizer"] = np.frombuffer(tokenizer_bytes, dtype=np.uint8).copy()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def evaluate_for_export(model, sp, heldout_text: str, tokenizer_name: str, extra: dict,
                        device: str = "cpu") -> dict:
    """Full and slice (first SLICE_CHUNKS chunks) llama-perplexity evaluations on the held-out text."""
    from evaluate import llama_perplexity, summarize, tokenize_with_bos

    cfg = model.cfg
    tokens = tokenize_with_bos(sp, heldout_text, cfg.bos_id)
    n_ctx = cfg.max_position_embeddings
    started = time.time()
    full = llama_perplexity(model, tokens, n_ctx, device=device)
    part = llama_perplexity(model, tokens, n_ctx, max_chunks=SLICE_CHUNKS, device=device)
    for result in (full, part):
        result["ffn_keep_rate"] = summarize(result["ffn_keep_rate"])
        result["attn_attended_beyond_k"] = summarize(result["attn_attended_beyond_k"])
    return {
        "method": ("llama-perplexity: whole text tokenized once with BOS prepended; "
                   "n_chunk = n_tokens // n_ctx; chunk i = tokens[i*n_ctx:(i+1)*n_ctx] with its "
                   "first token replaced by BOS, positions 0..n_ctx-1; scored positions "
                   "j in [n_ctx/2, n_ctx-1) predict token i*n_ctx+j+1; PPL = exp(mean NLL)"),
        "framework": "PyTorch (tools/train/spark_torch.py), float32, thresholds from float64 sums",
        "heldout_file": "models/heldout.txt",
        "tokenizer": tokenizer_name,
        "n_ctx": n_ctx,
        "full": full,
        "slice_first_8_chunks": part,
        "sparsity_notes": ("ffn_keep_rate[l] = mean fraction of the F neurons with a_j != 0; "
                           "attn_attended_beyond_k[l] = mean |S| over (query, head) pairs with "
                           "|C| > attn_k; both over all positions of the evaluated chunks"),
        "config": cfg.to_json_dict(),
        "eval_seconds": round(time.time() - started, 1),
        **extra,
    }


def write_eval(result: dict, path: Path) -> None:
    """Write the evaluation JSON atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)


def main() -> None:
    import sentencepiece as spm
    import torch

    from spark_torch import SparkConfig, SparkModel

    parser = argparse.ArgumentParser(description="Re-export a training state to the .npz checkpoint")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    state = torch.load(args.state, map_location="cpu", weights_only=False)
    model = SparkModel(SparkConfig(**state["config"]))
    model.load_state_dict(state["model"])
    write_checkpoint(model, args.tokenizer.read_bytes(), args.out)
    sp = spm.SentencePieceProcessor(model_file=str(args.tokenizer))
    result = evaluate_for_export(model, sp, args.heldout.read_text(encoding="utf-8"),
                                 args.tokenizer.name, state.get("train_info", {}))
    write_eval(result, args.out.with_suffix(".eval.json"))
    print(json.dumps({"ppl": result["full"]["ppl"], "slice_ppl": result["slice_first_8_chunks"]["ppl"]}))


if __name__ == "__main__":
    main()
