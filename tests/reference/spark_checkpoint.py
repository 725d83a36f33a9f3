#!/usr/bin/env python3
"""Random Spark checkpoints in the .npz format of SPEC.md section 5.

Written from SPEC.md alone, independent of the Rust code. Used by tests that need a checkpoint to
convert (``spark-convert``) and a float64 reference to compare against (``spark_ref.forward``).

Library use::

    from spark_checkpoint import default_tiny_config, make_checkpoint, save_checkpoint
    cfg = default_tiny_config(n_layers=3)
    arrays = make_checkpoint(cfg, seed=1)
    save_checkpoint("tiny.npz", arrays, dtype="bfloat16")
    cfg2, weights = load_checkpoint("tiny.npz")      # weights as float64

Command line::

    python tests/reference/spark_checkpoint.py OUT.npz [--config JSON|FILE] [--seed N]
        [--dtype float32|float16|bfloat16] [--split-k] [--dense] [--compressed] [--vocab-pad N]
        [--tokenizer FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import numpy as np

CONFIG_KEYS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "ffn_k",
    "ffn_r",
    "attn_k",
    "attn_r",
    "rms_norm_eps",
    "rope_theta",
    "query_pre_attn_scalar",
    "attn_logit_softcap",
    "final_logit_softcap",
    "sliding_window",
    "max_position_embeddings",
    "bos_id",
    "eos_id",
    "pad_id",
    "unk_id",
)

DTYPES = ("float32", "float16", "bfloat16")


def default_tiny_config(**overrides: Any) -> dict:
    """A small but complete section-6 config; keyword arguments override or add keys."""
    head_dim = overrides.get("head_dim", 16)
    cfg = {
        "vocab_size": 512,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": head_dim,
        "d_ff": 256,
        "ffn_k": 20,
        "ffn_r": 32,
        "attn_k": 8,
        "attn_r": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": head_dim,
        "attn_logit_softcap": 50.0,
        "final_logit_softcap": 30.0,
        "sliding_window": 24,
        "max_position_embeddings": 256,
        "bos_id": 2,
        "eos_id": 1,
        "pad_id": 0,
        "unk_id": 3,
    }
    cfg.update(overrides)
    return cfg


def validate_config(cfg: dict) -> None:
    """Raise ValueError naming the offending key if cfg violates SPEC sections 2 and 6."""
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"config is missing keys: {', '.join(missing)}")
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                "ffn_k", "ffn_r", "attn_k", "attn_r", "max_position_embeddings"):
        if not isinstance(cfg[key], int) or cfg[key] <= 0:
            raise ValueError(f"config key {key!r} must be a positive integer, got {cfg[key]!r}")
    if not cfg["ffn_r"] < cfg["d_model"]:
        raise ValueError("config key 'ffn_r' must be < d_model")
    if not cfg["attn_r"] < cfg["head_dim"]:
        raise ValueError("config key 'attn_r' must be < head_dim")
    if cfg["attn_r"] % 2 or (cfg["head_dim"] - cfg["attn_r"]) % 2:
        raise ValueError("config key 'attn_r' and head_dim - attn_r must both be even")
    if cfg["n_heads"] % cfg["n_kv_heads"]:
        raise ValueError("config key 'n_heads' must be a multiple of n_kv_heads")
    if cfg["query_pre_attn_scalar"] <= 0:
        raise ValueError("config key 'query_pre_attn_scalar' must be positive")
    if cfg["sliding_window"] <= 0:
        raise ValueError("config key 'sliding_window' must be positive")


def _normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def make_checkpoint(config: dict, seed: int = 0, split_k: bool = False, dense: bool = False,
                    vocab_pad: int = 0) -> dict:
    """Random float32 weights with SPEC section 5 names and shapes, plus the `config` entry.

    Weights are N(0, 1/fan_in); norm scales are N(0, 0.1^2) so (1 + scale) stays near 1.
    split_k: store `mlp/spark_k1` and `mlp/spark_k2` instead of the fused `mlp/spark_in`.
    dense: a Gemma-2 dense FFN (`mlp/gating_einsum` [2, D, F], `mlp/linear` [F, D]).
    vocab_pad: extra embedding rows beyond vocab_size (ignored by the model).
    """
    validate_config(config)
    if split_k and dense:
        raise ValueError("split_k and dense are mutually exclusive")
    if vocab_pad < 0:
        raise ValueError("vocab_pad must be >= 0")
    rng = np.random.default_rng(seed)
    V, D, L = config["vocab_size"], config["d_model"], config["n_layers"]
    N, KV, H, F = config["n_heads"], config["n_kv_heads"], config["head_dim"], config["d_ff"]
    r_f = config["ffn_r"]

    out: dict = {"config": np.array(json.dumps(config))}
    out["transformer/embedder/input_embedding"] = _normal(rng, (V + vocab_pad, D), 1 / math.sqrt(D))
    out["transformer/final_norm/scale"] = _normal(rng, (D,), 0.1)
    for l in range(L):
        p = f"transformer/layer_{l}/"
        out[p + "pre_attention_norm/scale"] = _normal(rng, (D,), 0.1)
        out[p + "attn/q_einsum/w"] = _normal(rng, (N, D, H), 1 / math.sqrt(D))
        out[p + "attn/kv_einsum/w"] = _normal(rng, (2, KV, D, H), 1 / math.sqrt(D))
        out[p + "attn/attn_vec_einsum/w"] = _normal(rng, (N, H, D), 1 / math.sqrt(N * H))
        out[p + "post_attention_norm/scale"] = _normal(rng, (D,), 0.1)
        out[p + "pre_ffw_norm/scale"] = _normal(rng, (D,), 0.1)
        if dense:
            out[p + "mlp/gating_einsum"] = _normal(rng, (2, D, F), 1 / math.sqrt(D))
        else:
            k1 = _normal(rng, (r_f, F), 1 / math.sqrt(r_f))
            k2 = _normal(rng, (D - r_f, F), 1 / math.sqrt(D - r_f))
            if split_k:
                out[p + "mlp/spark_k1"] = k1
                out[p + "mlp/spark_k2"] = k2
            else:
                out[p + "mlp/spark_in"] = np.concatenate([k1, k2], axis=0)
        out[p + "mlp/linear"] = _normal(rng, (F, D), 1 / math.sqrt(F))
        out[p + "post_ffw_norm/scale"] = _normal(rng, (D,), 0.1)
    return out


def _bfloat16():
    import ml_dtypes  # imported lazily: only bfloat16 needs it

    return ml_dtypes.bfloat16


def save_checkpoint(path: str, arrays: dict, dtype: str = "float32", compressed: bool = False,
                    tokenizer_bytes: bytes | None = None) -> None:
    """Write `arrays` (as returned by make_checkpoint) to `path` as .npz.

    dtype: float32, float16, or bfloat16 (stored as `|V2`; the config JSON then says
    `"dtype": "bfloat16"`). compressed uses np.savez_compressed. tokenizer_bytes adds a
    `tokenizer` entry (1-d uint8). The input dict is not modified.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if "config" not in arrays:
        raise ValueError("arrays has no 'config' entry")
    config = _config_from_entry(arrays["config"])
    config.pop("dtype", None)
    if dtype == "bfloat16":
        config["dtype"] = "bfloat16"
    out = {"config": np.array(json.dumps(config))}
    for name, arr in arrays.items():
        if name in ("config", "tokenizer"):
            continue
        a = np.asarray(arr, dtype=np.float32)
        if dtype == "float32":
            out[name] = a
        elif dtype == "float16":
            out[name] = a.astype(np.float16)
        else:
            out[name] = a.astype(_bfloat16()).view(np.dtype("V2"))
    if tokenizer_bytes is not None:
        out["tokenizer"] = np.frombuffer(bytes(tokenizer_bytes), dtype=np.uint8)
    elif "tokenizer" in arrays:
        out["tokenizer"] = np.asarray(arrays["tokenizer"], dtype=np.uint8)
    saver = np.savez_compressed if compressed else np.savez
    with open(path, "wb") as f:  # a file object keeps np.savez from appending ".npz"
        saver(f, **out)


def _config_from_entry(entry: np.ndarray) -> dict:
    entry = np.asarray(entry)
    if entry.dtype.kind == "U" and entry.ndim == 0:
        text = str(entry[()])
    elif entry.dtype == np.uint8 and entry.ndim == 1:
        text = entry.tobytes().decode("utf-8")
    else:
        raise ValueError(f"config entry must be 0-d unicode or 1-d uint8, got {entry.dtype} "
                         f"with shape {entry.shape}")
    return json.loads(text)


def load_checkpoint(path: str):
    """Read a section 5 .npz: returns (config dict, {name: float64 array}).

    `|V2` entries (and uint16 entries when the config says bfloat16) are decoded as bfloat16.
    A `tokenizer` entry is returned unchanged as uint8.
    """
    with np.load(path, allow_pickle=False) as z:
        if "config" not in z.files:
            raise ValueError(f"{path}: no 'config' entry")
        config = _config_from_entry(z["config"])
        is_bf16 = config.get("dtype") == "bfloat16"
        arrays = {}
        for name in z.files:
            if name == "config":
                continue
            a = z[name]
            if name == "tokenizer":
                arrays[name] = a
                continue
            if a.dtype.kind == "V" and a.dtype.itemsize == 2:
                a = a.view(_bfloat16())
            elif is_bf16 and a.dtype == np.uint16:
                a = a.view(_bfloat16())
            arrays[name] = a.astype(np.float64)
    return config, arrays


def _parse_config_arg(text: str | None) -> dict:
    if text is None:
        return default_tiny_config()
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    overrides = json.loads(text)
    if not isinstance(overrides, dict):
        raise ValueError("--config must be a JSON object")
    return default_tiny_config(**overrides)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write a random Spark checkpoint (.npz, SPEC section 5).")
    ap.add_argument("out", help="output .npz path")
    ap.add_argument("--config", help="JSON object (or a file holding one) overriding the tiny "
                                     "default config")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=DTYPES, default="float32")
    ap.add_argument("--split-k", action="store_true", help="store spark_k1/spark_k2")
    ap.add_argument("--dense", action="store_true", help="Gemma-2 dense FFN (gating_einsum)")
    ap.add_argument("--compressed", action="store_true", help="np.savez_compressed")
    ap.add_argument("--vocab-pad", type=int, default=0, help="extra embedding rows")
    ap.add_argument("--tokenizer", help="SentencePiece model file to embed as 'tokenizer'")
    args = ap.parse_args(argv)
    try:
        cfg = _parse_config_arg(args.config)
        arrays = make_checkpoint(cfg, seed=args.seed, split_k=args.split_k, dense=args.dense,
                                 vocab_pad=args.vocab_pad)
        tok = None
        if args.tokenizer:
            with open(args.tokenizer, "rb") as f:
                tok = f.read()
        save_checkpoint(args.out, arrays, dtype=args.dtype, compressed=args.compressed,
                        tokenizer_bytes=tok)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
