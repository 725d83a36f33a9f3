#!/usr/bin/env python3
"""Predicts the decode speed ratio of a Spark model over its stock Gemma-2 twin from the bytes a
step reads and the kernels it launches, to print beside a measured ratio.

    .venv/bin/python tools/predict-ratio.py SPARK.gguf STOCK.gguf [--tokens 1,4,16]
        [--depth 0,512,4096] [--kernels SPARK,STOCK] [--bandwidth GBPS] [--kernel-us US]
        [--cache-bytes 2] [--json]

The model of one decode step (S sequences of one new token each, every sequence at depth d):

  time = bytes / bandwidth + L * kernels_per_layer * kernel_us

Bytes (read from the files' tensor types and shapes, docs/SPEC.md sections 2-4):
- every matrix of the dense parts once per step: attention projections, norms, and the tied
  output matrix (`token_embd`, read whole for the logits); stock's FFN (gate, up, down) whole;
- Spark's FFN: K1 (`ffn_gate`) whole; K2 (`ffn_up`) and V (`ffn_down_t`) rows of the active
  neurons only. One token keeps k_f of F; S tokens choosing independently keep
  1 - (1 - k_f / F)^S of the rows;
- the KV cache (`--cache-bytes` per element, f16 = 2) of the c = d + 1 positions a query sees
  (min(d + 1, W) on the sliding layers, l even): stock reads K and V of all c; Spark reads the
  first r_a dimensions of K for all c (the predictor's scores) and, when c > k_a, the rest of K
  and all of V for at most min(c, N/KV * k_a) positions per KV head (the union of its query
  heads' k_a kept positions, an upper bound), else all c.

Without `--kernels` the prediction is the ratio of bytes alone (a CPU at its memory bandwidth,
where a launch costs nothing). With it (kernels per layer per step of each model, from a
profiler), each kernel adds a fixed `--kernel-us` (default 3.4 us: the 2.2 ms an H200 spent on
stock Gemma-2 2B's ~650 kernels beyond its bytes, 2026-11-27) and bandwidth defaults to the
H200's 3.1 TB/s the same run fitted. Not modelled: arithmetic (prefill and many sequences are
compute-bound, where this is an upper bound of Spark's gain), caches, overlap of launches.

Exit 0; 1 with one line for a file that is not a Spark / gemma2 pair; 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

H200_BANDWIDTH_GBPS = 3100.0
H200_KERNEL_US = 3.4


class PredictError(Exception):
    pass


@dataclass
class Model:
    """What a decode step's bytes depend on, read from one GGUF file."""
    path: Path
    arch: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    window: int
    ffn: int
    ffn_k: int | None       # Spark only
    attn_k: int | None
    attn_r: int | None
    tensor_bytes: dict      # name -> bytes in the file

    @property
    def spark(self) -> bool:
        return self.ffn_k is not None


def load(path: Path, gguf) -> Model:
    """The hyperparameters and tensor sizes of `path` (gguf-py's reader)."""
    try:
        r = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise PredictError(f"{path}: not a readable GGUF file ({e})") from e

    def value(key: str, required: bool = True):
        f = r.fields.get(key)
        if f is None:
            if required:
                raise PredictError(f"{path}: no key {key}")
            return None
        return f.contents()

    arch = value("general.architecture")
    if arch not in ("spark-gemma2", "gemma2"):
        raise PredictError(f"{path}: architecture {arch!r}, want spark-gemma2 or gemma2")
    spark = arch == "spark-gemma2"
    n_heads = int(value(f"{arch}.attention.head_count"))
    d = int(value(f"{arch}.embedding_length"))
    head_dim = value(f"{arch}.attention.key_length", required=False)
    return Model(
        path=path, arch=arch,
        n_layers=int(value(f"{arch}.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(value(f"{arch}.attention.head_count_kv")),
        head_dim=int(head_dim) if head_dim is not None else d // n_heads,
        window=int(value(f"{arch}.attention.sliding_window")),
        ffn=int(value(f"{arch}.feed_forward_length")),
        ffn_k=int(value(f"{arch}.spark.ffn_k")) if spark else None,
        attn_k=int(value(f"{arch}.spark.attn_k")) if spark else None,
        attn_r=int(value(f"{arch}.spark.attn_r")) if spark else None,
        tensor_bytes={t.name: int(t.n_bytes) for t in r.tensors},
    )


SPARSE_ROWS = re.compile(r"^blk\.\d+\.(ffn_up|ffn_down_t|ffn_k2v)\.weight$")


def kept_fraction(m: Model, tokens: int) -> float:
    """The share of K2 / V rows S tokens read: 1 - (1 - k_f / F)^S."""
    return 1.0 - (1.0 - m.ffn_k / m.ffn) ** tokens


def weight_bytes(m: Model, tokens: int) -> float:
    total = 0.0
    for name, n in m.tensor_bytes.items():
        if m.spark and SPARSE_ROWS.match(name):
            total += n * kept_fraction(m, tokens)
        else:
            total += n  # token_embd too: it is the tied output matrix, read whole
    return total


def kv_bytes(m: Model, depth: int, cache_bytes: float) -> float:
    """KV-cache bytes of one sequence's new token at `depth`, all layers."""
    total = 0.0
    for layer in range(m.n_layers):
        c = depth + 1
        if layer % 2 == 0:
            c = min(c, m.window)
        h = m.head_dim
        if not m.spark or c <= m.attn_k:
            elems = m.n_kv_heads * c * 2 * h
        else:
            kept = min(c, m.n_heads // m.n_kv_heads * m.attn_k)
            elems = m.n_kv_heads * (c * m.attn_r + kept * (2 * h - m.attn_r))
        total += elems * cache_bytes
    return total


def step_bytes(m: Model, tokens: int, depth: int, cache_bytes: float) -> float:
    return weight_bytes(m, tokens) + tokens * kv_bytes(m, depth, cache_bytes)


def predict(spark: Model, stock: Model, tokens: int, depth: int, cache_bytes: float,
            kernels: tuple[float, float] | None, bandwidth_gbps: float,
            kernel_us: float) -> dict:
    b_spark = step_bytes(spark, tokens, depth, cache_bytes)
    b_stock = step_bytes(stock, tokens, depth, cache_bytes)
    row = {"tokens": tokens, "depth": depth, "spark_mb": b_spark / 1e6, "stock_mb": b_stock / 1e6,
           "bytes_ratio": b_stock / b_spark}
    if kernels is None:
        row["predicted_ratio"] = row["bytes_ratio"]
        return row
    bw = bandwidth_gbps * 1e9
    t_spark = b_spark / bw + spark.n_layers * kernels[0] * kernel_us * 1e-6
    t_stock = b_stock / bw + stock.n_layers * kernels[1] * kernel_us * 1e-6
    row.update(spark_ms=t_spark * 1e3, stock_ms=t_stock * 1e3, predicted_ratio=t_stock / t_spark)
    return row


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated integers") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: negative")
    return values


def kernel_pair(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        pair = tuple(float(x) for x in parts)
    except ValueError:
        pair = ()
    if len(pair) != 2 or min(pair) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want SPARK,STOCK kernels per layer")
    return pair


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spark", type=Path, help="the spark-gemma2 GGUF file")
    ap.add_argument("stock", type=Path, help="the gemma2 GGUF file to compare with")
    ap.add_argument("--tokens", type=int_list, default=[1],
                    help="sequences decoded together (comma-separated; default 1)")
    ap.add_argument("--depth", type=int_list, default=[512],
                    help="positions already in each sequence (comma-separated; default 512)")
    ap.add_argument("--kernels", type=kernel_pair,
                    help="kernels per layer per step, SPARK,STOCK (e.g. 25,25); default: bytes only")
    ap.add_argument("--bandwidth", type=float, default=H200_BANDWIDTH_GBPS,
                    help=f"GB/s with --kernels (default {H200_BANDWIDTH_GBPS:.0f}, an H200)")
    ap.add_argument("--kernel-us", type=float, default=H200_KERNEL_US,
                    help=f"us per kernel with --kernels (default {H200_KERNEL_US})")
    ap.add_argument("--cache-bytes", type=float, default=2.0,
                    help="bytes per KV-cache element (default 2: f16)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    a = ap.parse_args(argv)
    if 0 in a.tokens:
        ap.error("--tokens: at least one sequence")
    try:
        import gguf
    except ImportError:
        print("predict-ratio: gguf-py is missing (the project's .venv has it; or PYTHONPATH="
              "llama.cpp/gguf-py)", file=sys.stderr)
        return 1
    try:
        spark, stock = load(a.spark, gguf), load(a.stock, gguf)
        if not spark.spark:
            raise PredictError(f"{a.spark}: {spark.arch}, want spark-gemma2 (first file)")
        if stock.spark:
            raise PredictError(f"{a.stock}: spark-gemma2, want gemma2 (second file)")
    except PredictError as e:
        print(f"predict-ratio: {e}", file=sys.stderr)
        return 1
    rows = [predict(spark, stock, s, d, a.cache_bytes, a.kernels, a.bandwidth, a.kernel_us)
            for s in a.tokens for d in a.depth]
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    timed = a.kernels is not None
    print(f"| sequences | depth | Spark MB/step | stock MB/step | bytes ratio |"
          + (" Spark ms | stock ms | predicted ratio |" if timed else ""))
    print("|---|---|---|---|---|" + ("---|---|---|" if timed else ""))
    for r in rows:
        line = (f"| {r['tokens']} | {r['depth']} | {r['spark_mb']:.1f} | {r['stock_mb']:.1f} | "
                f"{r['bytes_ratio']:.2f}x |")
        if timed:
            line += f" {r['spark_ms']:.3f} | {r['stock_ms']:.3f} | {r['predicted_ratio']:.2f}x |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
