"""PyTorch implementation of the Spark-Gemma2 forward pass (SPEC.md sections 1 and 4) for training.

Parameters are stored in the checkpoint layouts of SPEC section 5 (q_einsum [N, D, H], kv_einsum
[2, KV, D, H], attn_vec_einsum [N, H, D], spark_in [D, F], linear [F, D], norm `scale` with the
model computing 1 + scale), so export is a plain copy.

Gradients through the statistical top-k:
- FFN: theta = mean + std * Q(1 - k/F) is differentiated (autograd flows through the mean and the
  unbiased std, as in the paper); the relu's kink is the only non-smooth point.
- Attention: the kept set S is a boolean mask (not differentiated); gradients flow through the
  softmax over S and through softplus(q2 . k2).
Thresholds are computed from float64 sums in eval mode (as SPEC section 1 asks of inference); in
training mode they use the model's dtype, which only moves entries sitting on the threshold.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F_
from torch import nn


@dataclass
class SparkConfig:
    """Model hyperparameters; field names are the config JSON keys of SPEC section 6."""

    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    d_ff: int = 1024
    ffn_k: int = 82
    ffn_r: int = 128
    attn_k: int = 32
    attn_r: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    query_pre_attn_scalar: int = 64
    attn_logit_softcap: float = 50.0
    final_logit_softcap: float = 30.0
    sliding_window: int = 128
    max_position_embeddings: int = 256
    bos_id: int = 2
    eos_id: int = 1
    pad_id: int = 0
    unk_id: int = 3

    def validate(self) -> None:
        """Raise ValueError naming the first rule of SPEC section 2 that the config breaks."""
        checks = [
            (0 < self.ffn_r < self.d_model, "0 < ffn_r < d_model"),
            (0 < self.attn_r < self.head_dim, "0 < attn_r < head_dim"),
            (self.attn_r % 2 == 0 and (self.head_dim - self.attn_r) % 2 == 0,
             "attn_r and head_dim - attn_r even"),
            (self.ffn_k >= 1 and self.attn_k >= 1, "ffn_k >= 1 and attn_k >= 1"),
            (self.n_heads % self.n_kv_heads == 0, "n_heads % n_kv_heads == 0"),
        ]
        for ok, rule in checks:
            if not ok:
                raise ValueError(f"invalid Spark config: needs {rule}: {asdict(self)}")

    def to_json_dict(self) -> dict:
        """The SPEC section 6 config dictionary."""
        return asdict(self)


def norm_ppf(p: torch.Tensor) -> torch.Tensor:
    """Inverse standard normal CDF (float64, torch's ndtri)."""
    return torch.special.ndtri(p.to(torch.float64))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return F_.gelu(x, approximate="tanh")


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap); cap 0 is off."""
    return x if cap == 0 else cap * torch.tanh(x / cap)


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * (1 + scale)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + scale)


def ffn_soft_topk(s: torch.Tensor, k: int, precise: bool) -> torch.Tensor:
    """FFN form of the statistical top-k over the last axis: max(s - theta, 0); identity if k >= d."""
    d = s.shape[-1]
    if k >= d:
        return s
    q = float(norm_ppf(torch.tensor(1.0 - k / d)))
    if precise:
        s64 = s.to(torch.float64)
        mean = s64.sum(-1, keepdim=True) / d
        std = torch.sqrt(((s64 - mean) ** 2).sum(-1, keepdim=True) / (d - 1))
        theta = (mean + std * q).to(s.dtype)
    else:
        theta = s.mean(-1, keepdim=True) + s.std(-1, keepdim=True, correction=1) * q
    return torch.relu(s - theta)


def attention_keep_mask(s1: torch.Tensor, valid: torch.Tensor, k: int, precise: bool) -> torch.Tensor:
    """Kept set S of the attention form of the statistical top-k, as a boolean mask.

    s1 [..., T, T] (row = query); valid [T, T] is C. Rows with |C| <= k keep all of C; other rows
    keep j in C with s1_j > theta, theta from mean/unbiased std over C only; a row where nothing
    exceeds theta keeps the entries of C equal to the row maximum over C. Not differentiated.
    """
    with torch.no_grad():
        work = s1.to(torch.float64) if precise else s1.detach()
        count = valid.sum(-1).to(work.dtype)  # |C| per query row, [T]
        needs = count > k
        q = torch.where(needs, norm_ppf(1.0 - k / count.to(torch.float64).clamp(min=1.0)),
                        torch.zeros((), dtype=torch.float64)).to(work.dtype)
        zero = torch.zeros((), dtype=work.dtype)
        masked = torch.where(valid, work, zero)
        mean = masked.sum(-1, keepdim=True) / count.unsqueeze(-1)
        dev = torch.where(valid, work - mean, zero)
        std = torch.sqrt((dev * dev).sum(-1, keepdim=True) / (count - 1).clamp(min=1.0).unsqueeze(-1))
        theta = mean + std * q.unsqueeze(-1)
        keep = valid & ((work > theta) | ~needs.unsqueeze(-1))
        empty = ~keep.any(-1, keepdim=True)
        if bool(empty.any()):
            row_max = torch.where(valid, work, torch.full((), -math.inf, dtype=work.dtype))
            row_max = row_max.amax(-1, keepdim=True)
            keep = torch.where(empty, valid & (work == row_max), keep)
        return keep


def rope_tables(width: int, positions: torch.Tensor, base: float, dtype: torch.dtype):
    """cos, sin [T, width/2] for a NEOX rotary part of the given width."""
    half = width // 2
    inv_freq = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / width)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX rotation over the last axis of x [B, T, heads, m]; cos/sin [T, m/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def valid_positions(T: int, layer: int, window: int, device) -> torch.Tensor:
    """C as a [T, T] mask: j <= p, and p - W < j on even (sliding-window) layers."""
    p = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    mask = j <= p
    if layer % 2 == 0:
        mask = mask & (j > p - window)
    return mask


class SparkLayer(nn.Module):
    """One Gemma-2 block with Spark attention and the Spark FFN."""

    def __init__(self, cfg: SparkConfig, index: int):
        super().__init__()
        D, N, KV, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
        self.cfg = cfg
        self.index = index
        self.pre_attention_norm = nn.Parameter(torch.zeros(D))
        self.q_einsum = nn.Parameter(torch.randn(N, D, H) / math.sqrt(D))
        self.kv_einsum = nn.Parameter(torch.randn(2, KV, D, H) / math.sqrt(D))
        out_std = 1.0 / math.sqrt(N * H) / math.sqrt(2 * cfg.n_layers)
        self.attn_vec_einsum = nn.Parameter(torch.randn(N, H, D) * out_std)
        self.post_attention_norm = nn.Parameter(torch.zeros(D))
        self.pre_ffw_norm = nn.Parameter(torch.zeros(D))
        spark_in = torch.empty(D, F)
        spark_in[: cfg.ffn_r] = torch.randn(cfg.ffn_r, F) / math.sqrt(cfg.ffn_r)
        spark_in[cfg.ffn_r:] = torch.randn(D - cfg.ffn_r, F) / math.sqrt(D - cfg.ffn_r)
        self.spark_in = nn.Parameter(spark_in)
        self.linear = nn.Parameter(torch.randn(F, D) / math.sqrt(cfg.ffn_k) / math.sqrt(2 * cfg.n_layers))
        self.post_ffw_norm = nn.Parameter(torch.zeros(D))

    def attention(self, h, rope, stats):
        cfg = self.cfg
        B, T, _ = h.shape
        N, KV, r_a = cfg.n_heads, cfg.n_kv_heads, cfg.attn_r
        q = torch.einsum("btd,ndh->btnh", h, self.q_einsum)
        k = torch.einsum("btd,gdh->btgh", h, self.kv_einsum[0])
        v = torch.einsum("btd,gdh->btgh", h, self.kv_einsum[1])
        (c1, s1_), (c2, s2_) = rope
        scale = cfg.query_pre_attn_scalar ** -0.5
        q1 = apply_rope(q[..., :r_a], c1, s1_) * scale
        q2 = apply_rope(q[..., r_a:], c2, s2_) * scale
        k1 = apply_rope(k[..., :r_a], c1, s1_)
        k2 = apply_rope(k[..., r_a:], c2, s2_)
        group = N // KV
        k1 = k1.repeat_interleave(group, dim=2)
        k2 = k2.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        s1 = softcap(torch.einsum("bqnh,bknh->bnqk", q1, k1), cfg.attn_logit_softcap)
        s2 = torch.einsum("bqnh,bknh->bnqk", q2, k2)
        valid = valid_positions(T, self.index, cfg.sliding_window, h.device)
        keep = attention_keep_mask(s1, valid, cfg.attn_k, precise=not self.training)
        probs = torch.softmax(s1.masked_fill(~keep, -math.inf), dim=-1)
        w = probs * F_.softplus(s2)
        o = torch.einsum("bnqk,bknh->bqnh", w, v)
        if stats is not None:
            attended = keep.sum(-1).to(torch.float64)  # [B, N, T]
            beyond = valid.sum(-1) > cfg.attn_k         # [T]
            stats.setdefault("attn_attended_sum", [0.0] * cfg.n_layers)
            stats.setdefault("attn_attended_count", [0] * cfg.n_layers)
            stats["attn_attended_sum"][self.index] += float(attended[:, :, beyond].sum())
            stats["attn_attended_count"][self.index] += int(attended[:, :, beyond].numel())
        return torch.einsum("btnh,nhd->btd", o, self.attn_vec_einsum)

    def ffn(self, h, stats):
        cfg = self.cfg
        r_f = cfg.ffn_r
        s = h[..., :r_f] @ self.spark_in[:r_f]
        a = gelu_tanh(ffn_soft_topk(s, cfg.ffn_k, precise=not self.training))
        u = a * (h[..., r_f:] @ self.spark_in[r_f:])
        if stats is not None:
            stats.setdefault("ffn_active_sum", [0.0] * cfg.n_layers)
            stats.setdefault("ffn_token_count", [0] * cfg.n_layers)
            stats["ffn_active_sum"][self.index] += float((a != 0).sum())
            stats["ffn_token_count"][self.index] += int(a.shape[0] * a.shape[1])
        return u @ self.linear

    def forward(self, x, rope, stats=None):
        eps = self.cfg.rms_norm_eps
        h = rms_norm(x, self.pre_attention_norm, eps)
        x = x + rms_norm(self.attention(h, rope, stats), self.post_attention_norm, eps)
        h = rms_norm(x, self.pre_ffw_norm, eps)
        return x + rms_norm(self.ffn(h, stats), self.post_ffw_norm, eps)


class SparkModel(nn.Module):
    """Spark-Gemma2 language model: tied embedding, final RMSNorm, final logit soft-cap."""

    def __init__(self, cfg: SparkConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.input_embedding = nn.Parameter(torch.randn(cfg.vocab_size, cfg.d_model) / math.sqrt(cfg.d_model))
        self.layers = nn.ModuleList(SparkLayer(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, tokens: torch.Tensor, stats: dict | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] for tokens [B, T] at positions 0..T-1."""
        cfg = self.cfg
        _, T = tokens.shape
        dtype = self.input_embedding.dtype
        pos = torch.arange(T, device=tokens.device)
        rope = tuple(
            tuple(t.to(tokens.device) for t in rope_tables(w, pos.cpu(), cfg.rope_theta, dtype))
            for w in (cfg.attn_r, cfg.head_dim - cfg.attn_r)
        )
        x = self.input_embedding[tokens] * math.sqrt(cfg.d_model)
        for layer in self.layers:
            x = layer(x, rope, stats)
        x = rms_norm(x, self.final_norm, cfg.rms_norm_eps)
        return softcap(x @ self.input_embedding.T, cfg.final_logit_softcap)

    def checkpoint_arrays(self) -> dict:
        """float32 numpy arrays keyed by the SPEC section 5 names (without config/tokenizer)."""
        def arr(p):
            return p.detach().to("cpu", torch.float32).numpy().copy()

        out = {
            "transformer/embedder/input_embedding": arr(self.input_embedding),
            "transformer/final_norm/scale": arr(self.final_norm),
        }
        for i, layer in enumerate(self.layers):
            pre = f"transformer/layer_{i}/"
            out[pre + "pre_attention_norm/scale"] = arr(layer.pre_attention_norm)
            out[pre + "attn/q_einsum/w"] = arr(layer.q_einsum)
            out[pre + "attn/kv_einsum/w"] = arr(layer.kv_einsum)
            out[pre + "attn/attn_vec_einsum/w"] = arr(layer.attn_vec_einsum)
            out[pre + "post_attention_norm/scale"] = arr(layer.post_attention_norm)
            out[pre + "pre_ffw_norm/scale"] = arr(layer.pre_ffw_norm)
            out[pre + "mlp/spark_in"] = arr(layer.spark_in)
            out[pre + "mlp/linear"] = arr(layer.linear)
            out[pre + "post_ffw_norm/scale"] = arr(layer.post_ffw_norm)
        return out

    def load_checkpoint_arrays(self, arrays: dict) -> None:
        """Inverse of checkpoint_arrays (shapes must match)."""
        def put(p, name):
            if name not in arrays:
                raise KeyError(f"checkpoint has no entry {name!r}")
            value = torch.as_tensor(arrays[name], dtype=p.dtype)
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(p.shape)}")
            with torch.no_grad():
                p.copy_(value)

        put(self.input_embedding, "transformer/embedder/input_embedding")
        put(self.final_norm, "transformer/final_norm/scale")
        for i, layer in enumerate(self.layers):
            pre = f"transformer/layer_{i}/"
            put(layer.pre_attention_norm, pre + "pre_attention_norm/scale")
            put(layer.q_einsum, pre + "attn/q_einsum/w")
            put(layer.kv_einsum, pre + "attn/kv_einsum/w")
            put(layer.attn_vec_einsum, pre + "attn/attn_vec_einsum/w")
            put(layer.post_attention_norm, pre + "post_attention_norm/scale")
            put(layer.pre_ffw_norm, pre + "pre_ffw_norm/scale")
            put(layer.spark_in, pre + "mlp/spark_in")
            put(layer.linear, pre + "mlp/linear")
            put(layer.post_ffw_norm, pre + "post_ffw_norm/scale")
