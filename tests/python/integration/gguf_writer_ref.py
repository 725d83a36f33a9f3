"""A second, independent way to write a Spark-Gemma2 GGUF from a SPEC section 5 checkpoint, with
gguf-py's GGUFWriter (SPEC sections 2 and 3). The tests use it to check that the patched llama.cpp
reads exactly what SPEC describes, independent of spark-convert."""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType  # type: ignore

ARCH = "spark-gemma2"


def _vocab(n: int):
    """A SentencePiece-style vocabulary: Gemma's special ids, the 256 byte pieces, then fillers."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [3, 3, 3, 2]  # control, control, control, unknown
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # byte
    i = 0
    while len(tokens) < n:
        tokens.append(f"\u2581w{i}")
        types.append(1)
        i += 1
    tokens, types = tokens[:n], types[:n]
    scores = [0.0] * 4 + [0.0] * 256 + [-float(j) for j in range(max(0, n - 260))]
    return tokens, scores[:n], types


def write_spark_gguf(path: str, cfg: dict, w: dict, skip_tensors=(), float_keys=(), arch: str = ARCH) -> None:
    """Writes `w` (float64 arrays by SPEC section 5 names, e.g. from load_checkpoint) as f32.

    For error tests: `skip_tensors` names tensors to leave out, `float_keys` names spark.* keys
    (e.g. "spark.ffn_k") to store as float32 instead of uint32, `arch` replaces the architecture."""
    D, L, F = cfg["d_model"], cfg["n_layers"], cfg["d_ff"]
    N, KV, H = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    rf, V = cfg["ffn_r"], cfg["vocab_size"]
    ARCH = arch  # noqa: N806 (shadows the module constant on purpose)
    g = GGUFWriter(path, ARCH)
    g.add_uint32(f"{ARCH}.context_length", cfg["max_position_embeddings"])
    g.add_uint32(f"{ARCH}.embedding_length", D)
    g.add_uint32(f"{ARCH}.block_count", L)
    g.add_uint32(f"{ARCH}.feed_forward_length", F)
    g.add_uint32(f"{ARCH}.attention.head_count", N)
    g.add_uint32(f"{ARCH}.attention.head_count_kv", KV)
    g.add_uint32(f"{ARCH}.attention.key_length", H)
    g.add_uint32(f"{ARCH}.attention.value_length", H)
    g.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    g.add_uint32(f"{ARCH}.attention.sliding_window", cfg["sliding_window"])
    g.add_float32(f"{ARCH}.attention.scale", 1.0 / math.sqrt(cfg["query_pre_attn_scalar"]))
    g.add_float32(f"{ARCH}.attn_logit_softcapping", cfg["attn_logit_softcap"])
    g.add_float32(f"{ARCH}.final_logit_softcapping", cfg["final_logit_softcap"])
    g.add_float32(f"{ARCH}.rope.freq_base", cfg["rope_theta"])
    for key in ("ffn_k", "ffn_r", "attn_k", "attn_r"):
        if f"spark.{key}" in float_keys:
            g.add_float32(f"{ARCH}.spark.{key}", float(cfg[key]))
        else:
            g.add_uint32(f"{ARCH}.spark.{key}", cfg[key])
    tokens, scores, types = _vocab(V)
    g.add_string("tokenizer.ggml.model", "llama")
    g.add_array("tokenizer.ggml.tokens", tokens)
    g.add_array("tokenizer.ggml.scores", scores)
    g.add_array("tokenizer.ggml.token_type", types)
    g.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_id"])
    g.add_uint32("tokenizer.ggml.eos_token_id", cfg["eos_id"])
    g.add_uint32("tokenizer.ggml.padding_token_id", cfg["pad_id"])
    g.add_uint32("tokenizer.ggml.unknown_token_id", cfg["unk_id"])
    g.add_uint32("general.file_type", 0)

    def t(name, arr):  # numpy shape = reversed ggml ne
        if name in skip_tensors:
            return
        g.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32), raw_dtype=GGMLQuantizationType.F32)

    p = "transformer"
    t("token_embd.weight", w[f"{p}/embedder/input_embedding"][:V])
    t("output_norm.weight", 1.0 + w[f"{p}/final_norm/scale"])
    for l in range(L):
        q = f"{p}/layer_{l}"
        t(f"blk.{l}.attn_norm.weight", 1.0 + w[f"{q}/pre_attention_norm/scale"])
        wq = w[f"{q}/attn/q_einsum/w"]  # [N, D, H]
        kv = w[f"{q}/attn/kv_einsum/w"]  # [2, KV, D, H]
        wo = w[f"{q}/attn/attn_vec_einsum/w"]  # [N, H, D]
        t(f"blk.{l}.attn_q.weight", wq.transpose(0, 2, 1).reshape(N * H, D))
        t(f"blk.{l}.attn_k.weight", kv[0].transpose(0, 2, 1).reshape(KV * H, D))
        t(f"blk.{l}.attn_v.weight", kv[1].transpose(0, 2, 1).reshape(KV * H, D))
        t(f"blk.{l}.attn_output.weight", wo.reshape(N * H, D).T)
        t(f"blk.{l}.post_attention_norm.weight", 1.0 + w[f"{q}/post_attention_norm/scale"])
        t(f"blk.{l}.ffn_norm.weight", 1.0 + w[f"{q}/pre_ffw_norm/scale"])
        if f"{q}/mlp/spark_in" in w:
            k = w[f"{q}/mlp/spark_in"]  # [D, F]
            k1, k2 = k[:rf], k[rf:]
        else:
            k1, k2 = w[f"{q}/mlp/spark_k1"], w[f"{q}/mlp/spark_k2"]
        t(f"blk.{l}.ffn_gate.weight", k1.T)  # ne [r_f, F]
        t(f"blk.{l}.ffn_up.weight", k2.T)  # ne [D - r_f, F]
        t(f"blk.{l}.ffn_down_t.weight", w[f"{q}/mlp/linear"])  # [F, D] -> ne [D, F]
        t(f"blk.{l}.post_ffw_norm.weight", 1.0 + w[f"{q}/post_ffw_norm/scale"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
