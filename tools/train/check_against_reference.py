"""Compare the PyTorch model with the float64 NumPy reference (tests/reference/spark_ref.py).

Loads the exported .npz through the reference's own loader (so layout/transposition bugs in the
export show up), runs both forwards on a few held-out sequences (llama-perplexity chunk layout:
BOS then text) and reports per-position relative logit error (||a - b|| / ||b||; median, 90th
percentile, max), top-1 agreement, and the per-layer sparsity statistics of both.

    ../train-venv/bin/python tools/train/check_against_reference.py models/spark-shakespeare.npz
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "tests" / "reference"))

from spark_torch import SparkConfig, SparkModel  # noqa: E402


def main() -> None:
    import sentencepiece as spm
    import spark_checkpoint
    import spark_ref

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--heldout", type=Path, default=HERE.parent.parent / "models" / "heldout.txt")
    parser.add_argument("--sequences", type=int, default=3)
    parser.add_argument("--length", type=int, default=0, help="tokens per sequence (0 = context)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config, weights = spark_checkpoint.load_checkpoint(args.checkpoint)
    spark_checkpoint.validate_config(config)
    cfg = SparkConfig(**config)
    model = SparkModel(cfg)
    with np.load(args.checkpoint) as npz:
        model.load_checkpoint_arrays({k: npz[k] for k in npz.files})
        tok_bytes = npz["tokenizer"].tobytes()
    model = model.to(getattr(torch, args.dtype)).eval()
    sp = spm.SentencePieceProcessor(model_proto=tok_bytes)
    ids = [cfg.bos_id] + sp.encode(args.heldout.read_text(encoding="utf-8"))
    T = args.length or cfg.max_position_embeddings
    n_chunks = len(ids) // T
    picks = np.linspace(0, n_chunks - 1, args.sequences).round().astype(int)

    rel_all, top1_all = [], []
    per_seq = []
    for c in picks:
        seq = list(ids[c * T:(c + 1) * T])
        seq[0] = cfg.bos_id
        ref_logits, ref_stats = spark_ref.forward(config, weights, seq, return_stats=True)
        stats: dict = {}
        with torch.no_grad():
            ours = model(torch.tensor([seq]), stats)[0].to(torch.float64).numpy()
        rel = np.linalg.norm(ours - ref_logits, axis=-1) / np.linalg.norm(ref_logits, axis=-1)
        top1 = ours.argmax(-1) == ref_logits.argmax(-1)
        rel_all.append(rel)
        top1_all.append(top1)
        our_keep = [a / (n * cfg.d_ff) for a, n in zip(stats["ffn_active_sum"], stats["ffn_token_count"])]
        our_att = [s / n for s, n in zip(stats["attn_attended_sum"], stats["attn_attended_count"])]
        per_seq.append({
            "chunk": int(c),
            "median_rel": float(np.median(rel)),
            "p90_rel": float(np.percentile(rel, 90)),
            "max_rel": float(rel.max()),
            "top1_agree": float(top1.mean()),
            "ffn_keep_ours": [round(v, 5) for v in our_keep],
            "ffn_keep_ref": [round(v, 5) for v in ref_stats["ffn_keep_fraction"]],
            "attended_ours": [round(v, 3) for v in our_att],
            "attended_ref": [round(v, 3) for v in ref_stats["attn_attended_full"]],
        })
    rel = np.concatenate(rel_all)
    top1 = np.concatenate(top1_all)
    summary = {
        "checkpoint": str(args.checkpoint),
        "framework_dtype": args.dtype,
        "positions": int(rel.size),
        "median_rel": float(np.median(rel)),
        "p90_rel": float(np.percentile(rel, 90)),
        "p99_rel": float(np.percentile(rel, 99)),
        "max_rel": float(rel.max()),
        "top1_agree": float(top1.mean()),
        "sequences": per_seq,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
