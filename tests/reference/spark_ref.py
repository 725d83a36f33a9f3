"""Float64 reference of the Spark-Gemma2 math (SPEC.md sections 1 and 4), NumPy only.

Written from SPEC.md alone, independent of the Rust code, and kept deliberately plain: loops over
layers, heads and query positions, with NumPy for the inner products. Other tests compare the
converter, the CPU/CUDA kernels and the llama.cpp integration against `forward()`.

Weights are the checkpoint arrays of SPEC section 5 (see `spark_checkpoint.load_checkpoint`), keyed
by their npz names: fused `mlp/spark_in` or split `mlp/spark_k1` + `mlp/spark_k2`, or the dense
Gemma-2 `mlp/gating_einsum` variant.
"""

from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------------------------------------
# Inverse normal CDF
# ---------------------------------------------------------------------------------------------

# Acklam's rational approximation (relative error ~1.15e-9), refined below by one Halley step.
_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
      1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
      6.680131188771972e01, -1.328068155288572e01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
      -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
      3.754408661907416e00)
_P_LOW = 0.02425


def _acklam_lower_half(p: float) -> float:
    """Acklam's approximation of Q(p) for 0 < p <= 0.5."""
    if p < _P_LOW:
        q = math.sqrt(-2.0 * math.log(p))
        num = ((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]
        den = (((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0
        return num / den
    q = p - 0.5
    r = q * q
    num = (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q
    den = ((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0
    return num / den


def norm_ppf(p: float) -> float:
    """Inverse CDF of N(0, 1), accurate to ~1e-15 relative on (1e-300, 1 - 1e-16).

    Acklam's approximation plus one Halley step against Phi(x) = erfc(-x / sqrt 2) / 2. For
    p > 1/2 it uses Q(p) = -Q(1 - p); 1 - p is exact there, and the lower tail is where erfc keeps
    full relative precision.
    """
    p = float(p)
    if not 0.0 < p < 1.0:
        raise ValueError(f"norm_ppf needs 0 < p < 1, got {p!r}")
    if p > 0.5:
        return -norm_ppf(1.0 - p)
    if p == 0.5:
        return 0.0
    x = _acklam_lower_half(p)
    e = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p
    u = e * math.sqrt(2.0 * math.pi) * math.exp(0.5 * x * x)
    return x - u / (1.0 + 0.5 * x * u)


# ---------------------------------------------------------------------------------------------
# Statistical top-k (SPEC section 1)
# ---------------------------------------------------------------------------------------------


def _check_k(k: int) -> None:
    if int(k) != k or k < 1:
        raise ValueError(f"statistical top-k needs an integer k >= 1, got {k!r}")


def stat_topk_threshold(x, k: int) -> float:
    """theta = mean(x) + std(x) * Q(1 - k/d), std unbiased (divides by d - 1). Needs 1 <= k < d."""
    _check_k(k)
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1] if x.ndim else 0
    if x.ndim != 1 or not k < d:
        raise ValueError(f"threshold needs a 1-d vector with k < d, got shape {x.shape}, k={k}")
    mean = x.sum() / d
    std = math.sqrt(((x - mean) ** 2).sum() / (d - 1))
    return mean + std * norm_ppf(1.0 - k / d)


def soft(x, k: int) -> np.ndarray:
    """FFN form: max(x - theta, 0); identity when k >= d; all zeros when nothing exceeds theta."""
    _check_k(k)
    x = np.asarray(x, dtype=np.float64)
    if k >= x.shape[0]:
        return x.copy()
    theta = stat_topk_threshold(x, k)
    return np.maximum(x - theta, 0.0)


def neg(x, k: int) -> np.ndarray:
    """Attention form: x where x > theta, else -inf; identity when k >= d.

    If no entry exceeds theta, every entry equal to max(x) is kept. Never NaN.
    """
    _check_k(k)
    x = np.asarray(x, dtype=np.float64)
    if k >= x.shape[0]:
        return x.copy()
    theta = stat_topk_threshold(x, k)
    keep = x > theta
    if not keep.any():
        keep = x == x.max()
    return np.where(keep, x, -np.inf)


# ---------------------------------------------------------------------------------------------
# Building blocks (SPEC section 4)
# ---------------------------------------------------------------------------------------------


def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def softplus(x):
    """log(1 + exp(x)), computed without overflow."""
    return np.logaddexp(0.0, np.asarray(x, dtype=np.float64))


def softcap(x, cap: float):
    """cap * tanh(x / cap); cap == 0 means no capping."""
    x = np.asarray(x, dtype=np.float64)
    if cap == 0:
        return x
    return cap * np.tanh(x / cap)


def rms_norm(x, scale, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * (1 + scale), over the last axis (scale is the stored Gemma scale)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + np.asarray(scale))


def rope_neox(x, positions, base: float) -> np.ndarray:
    """NEOX rotary embedding over the last axis (width m): pair (i, i + m/2) rotates by p * base^(-2i/m).

    x has shape [T, ..., m]; positions has shape [T].
    """
    x = np.asarray(x, dtype=np.float64)
    m = x.shape[-1]
    if m % 2:
        raise ValueError(f"rotary width must be even, got {m}")
    half = m // 2
    inv_freq = base ** (-2.0 * np.arange(half) / m)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, half]
    shape = (ang.shape[0],) + (1,) * (x.ndim - 2) + (half,)
    cos = np.cos(ang).reshape(shape)
    sin = np.sin(ang).reshape(shape)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


# ---------------------------------------------------------------------------------------------
# FFN: the dense formula and a sparse evaluation that visits only active neurons
# ---------------------------------------------------------------------------------------------


def spark_ffn_dense(h, k1, k2, v, ffn_k: int) -> tuple[np.ndarray, int]:
    """Dense formula of the Spark FFN for one token.

    h [D]; k1 [r_f, F]; k2 [D - r_f, F]; v [F, D]. Returns (output [D], number of nonzero a_j).
    """
    r_f = k1.shape[0]
    s = h[:r_f] @ k1
    a = gelu_tanh(soft(s, ffn_k))
    u = a * (h[r_f:] @ k2)
    return u @ v, int(np.count_nonzero(a))


def spark_ffn_sparse(h, k1, k2, v, ffn_k: int) -> np.ndarray:
    """The same FFN evaluated the sparse way: K2 and V are touched only for neurons with a_j != 0."""
    r_f = k1.shape[0]
    s = h[:r_f] @ k1
    a = gelu_tanh(soft(s, ffn_k))
    out = np.zeros(v.shape[1], dtype=np.float64)
    h2 = h[r_f:]
    for j in np.flatnonzero(a):
        out += (a[j] * float(h2 @ k2[:, j])) * v[j]
    return out


def gemma2_ffn_dense(h, gate, up, down) -> np.ndarray:
    """Gemma-2 dense FFN: (gelu_tanh(h gate) * (h up)) down; gate, up [D, F]; down [F, D]."""
    return (gelu_tanh(h @ gate) * (h @ up)) @ down


# ---------------------------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------------------------


def _w(weights: dict, name: str) -> np.ndarray:
    if name not in weights:
        raise KeyError(f"checkpoint has no entry {name!r}")
    return np.asarray(weights[name], dtype=np.float64)


def _ffn_weights(weights: dict, prefix: str, cfg: dict):
    """Returns ("spark", k1, k2, v) or ("dense", gate, up, v) for layer prefix."""
    D, F, r_f = cfg["d_model"], cfg["d_ff"], cfg["ffn_r"]
    v = _w(weights, prefix + "mlp/linear")
    if prefix + "mlp/gating_einsum" in weights:
        g = _w(weights, prefix + "mlp/gating_einsum")
        if g.shape == (2, D, F):
            return "dense", g[0], g[1], v
        if g.shape == (2, F, D):
            return "dense", g[0].T, g[1].T, v
        raise ValueError(f"{prefix}mlp/gating_einsum has shape {g.shape}, expected (2, D, F)")
    if prefix + "mlp/spark_in" in weights:
        k = _w(weights, prefix + "mlp/spark_in")
        return "spark", k[:r_f], k[r_f:], v
    return "spark", _w(weights, prefix + "mlp/spark_k1"), _w(weights, prefix + "mlp/spark_k2"), v


def attention_window(p: int, layer: int, window: int) -> range:
    """Valid key positions C for query p: all j <= p, or p - W < j <= p on even (sliding) layers."""
    if layer % 2 == 0:
        return range(max(0, p - window + 1), p + 1)
    return range(0, p + 1)


def spark_attention(q, k, v, layer: int, cfg: dict, stats: list | None = None) -> np.ndarray:
    """Spark attention for one layer. q [T, N, H], k and v [T, KV, H], already roped and scaled.

    Returns o [T, N, H]. If stats is a list, appends |S| for every (query position, head).
    """
    T, N, H = q.shape
    KV = k.shape[1]
    r_a, k_a = cfg["attn_r"], cfg["attn_k"]
    cap = cfg["attn_logit_softcap"]
    group = N // KV
    o = np.zeros((T, N, H), dtype=np.float64)
    for n in range(N):
        g = n // group
        s1_all = softcap(q[:, n, :r_a] @ k[:, g, :r_a].T, cap)   # [T, T], row = query
        s2_all = q[:, n, r_a:] @ k[:, g, r_a:].T                  # [T, T]
        for p in range(T):
            c = np.array(attention_window(p, layer, cfg["sliding_window"]))
            s1 = s1_all[p, c]
            sel = s1 if len(c) <= k_a else neg(s1, k_a)
            keep = np.isfinite(sel)
            idx = c[keep]
            z = s1[keep]
            e = np.exp(z - z.max())
            w = e / e.sum() * softplus(s2_all[p, idx])
            o[p, n] = w @ v[idx, g]
            if stats is not None:
                stats.append(len(idx))
    return o


def stored_kv(x, kv_type: str | None) -> np.ndarray:
    """x [T, KV, H] as a KV cache of ggml type `kv_type` (f16, bf16, q8_0, q4_0, q4_1, q5_0,
    q5_1, ...) holds it: each head's row of H values rounded to f32, quantized with gguf-py's
    quantizers (NumPy ports of ggml's reference ones) and read back. None: exact."""
    if kv_type is None:
        return x
    from gguf import GGMLQuantizationType, quants

    ty = GGMLQuantizationType[kv_type.upper()]
    rows = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    return quants.dequantize(quants.quantize(rows, ty), ty).astype(np.float64).reshape(x.shape)


def forward(config: dict, weights: dict, tokens, return_stats: bool = False, kv_type: str | None = None):
    """Float64 logits [T, vocab_size] of SPEC section 4 for token ids `tokens` at positions 0..T-1.

    kv_type: the KV cache's ggml type (stored_kv): keys (after RoPE) and values are read back
    as that cache stores them; None keeps them exact.

    With return_stats, also returns a dict with per-layer lists:
      ffn_keep_fraction: mean over tokens of #{a_j != 0} / F (FFN activity; 1.0-ish for dense);
      attn_attended: mean |S| over (position, head);
      attn_attended_full: mean |S| over the (position, head) pairs whose window |C| > attn_k.
    """
    cfg = config
    V, D, L = cfg["vocab_size"], cfg["d_model"], cfg["n_layers"]
    N, KV, H = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    eps, r_a = cfg["rms_norm_eps"], cfg["attn_r"]
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError("tokens must be a non-empty 1-d sequence")
    if tokens.min() < 0 or tokens.max() >= V:
        raise ValueError(f"token ids must lie in [0, {V})")
    T = tokens.size
    pos = np.arange(T)
    scale = 1.0 / math.sqrt(cfg["query_pre_attn_scalar"])
    base = cfg["rope_theta"]

    emb = _w(weights, "transformer/embedder/input_embedding")
    if emb.ndim != 2 or emb.shape[0] < V or emb.shape[1] != D:
        raise ValueError(f"input_embedding has shape {emb.shape}, expected (>= {V}, {D})")
    emb = emb[:V]
    x = emb[tokens] * math.sqrt(D)

    stats = {"ffn_keep_fraction": [], "attn_attended": [], "attn_attended_full": []}
    for l in range(L):
        pre = f"transformer/layer_{l}/"
        h = rms_norm(x, _w(weights, pre + "pre_attention_norm/scale"), eps)
        wq = _w(weights, pre + "attn/q_einsum/w")                 # [N, D, H]
        wkv = _w(weights, pre + "attn/kv_einsum/w")               # [2, KV, D, H]
        wo = _w(weights, pre + "attn/attn_vec_einsum/w")          # [N, H, D]
        q = np.einsum("td,ndh->tnh", h, wq)
        k = np.einsum("td,gdh->tgh", h, wkv[0])
        v = np.einsum("td,gdh->tgh", h, wkv[1])
        q = np.concatenate([rope_neox(q[..., :r_a], pos, base),
                            rope_neox(q[..., r_a:], pos, base)], axis=-1) * scale
        k = np.concatenate([rope_neox(k[..., :r_a], pos, base),
                            rope_neox(k[..., r_a:], pos, base)], axis=-1)
        k, v = stored_kv(k, kv_type), stored_kv(v, kv_type)
        attended: list = []
        o = spark_attention(q, k, v, l, cfg, attended)
        attn_out = np.einsum("tnh,nhd->td", o, wo)
        x = x + rms_norm(attn_out, _w(weights, pre + "post_attention_norm/scale"), eps)

        h = rms_norm(x, _w(weights, pre + "pre_ffw_norm/scale"), eps)
        kind, w1, w2, wv = _ffn_weights(weights, pre, cfg)
        ffn = np.zeros_like(x)
        active = 0
        for t in range(T):
            if kind == "spark":
                ffn[t], n_active = spark_ffn_dense(h[t], w1, w2, wv, cfg["ffn_k"])
                active += n_active
            else:
                ffn[t] = gemma2_ffn_dense(h[t], w1, w2, wv)
                active += int(np.count_nonzero(gelu_tanh(h[t] @ w1)))
        x = x + rms_norm(ffn, _w(weights, pre + "post_ffw_norm/scale"), eps)

        stats["ffn_keep_fraction"].append(active / (T * cfg["d_ff"]))
        stats["attn_attended"].append(float(np.mean(attended)))
        full = [
            attended[n * T + p]
            for n in range(N)
            for p in range(T)
            if len(attention_window(p, l, cfg["sliding_window"])) > cfg["attn_k"]
        ]
        stats["attn_attended_full"].append(float(np.mean(full)) if full else float("nan"))

    xf = rms_norm(x, _w(weights, "transformer/final_norm/scale"), eps)
    logits = softcap(xf @ emb.T, cfg["final_logit_softcap"])
    if return_stats:
        return logits, stats
    return logits
