"""Tests of the float64 reference (spark_ref) and the checkpoint generator (spark_checkpoint).

Run from the repository root: .venv/bin/python -m pytest tests/reference -q
"""

import json
import math
import os
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest

import spark_checkpoint as ckpt
import spark_ref as ref

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------
# norm_ppf
# ---------------------------------------------------------------------------------------------

# Q(p) for the double p, from mpmath at 40 digits (sqrt(2) * erfinv(2p - 1)).
KNOWN_PPF = [
    (0.975, 1.9599639845400542355),
    (0.5, 0.0),
    (0.95, 1.6448536269514727149),
    (0.99, 2.3263478740408411009),
    (0.999, 3.0902323061678135415),
    (1e-10, -6.3613409024040562047),
    (1e-12, -7.0344838253011319298),
    (0.02425, -1.9729610513118848503),  # Acklam's region boundary
    (0.97575, 1.9729610513118848503),
    (0.3, -0.52440051270804078404),
    (1 - 1e-12, 7.0344869100478352057),  # the double nearest 1 - 1e-12
    (1 - 1e-9, 5.9978070196016374264),
    (1 - 1106 / 13824, 1.4050326350006996447),
    (1 - 256 / 4096, 1.5341205443525463117),
]


@pytest.mark.parametrize("p,expected", KNOWN_PPF)
def test_norm_ppf_known_values(p, expected):
    assert abs(ref.norm_ppf(p) - expected) <= 1e-12 * max(1.0, abs(expected))


def test_norm_ppf_cdf_round_trip():
    tails = np.logspace(-12, math.log10(0.5), 3000)
    grid = np.concatenate([tails, 1.0 - tails, np.linspace(1e-6, 1 - 1e-6, 3001)])
    worst = 0.0
    for p in grid:
        x = ref.norm_ppf(p)
        # compare in the tail where the CDF is small, so the check is relative there
        if p <= 0.5:
            back = 0.5 * math.erfc(-x / math.sqrt(2.0))
            err = abs(back - p) / p
        else:
            back = 0.5 * math.erfc(x / math.sqrt(2.0))
            err = abs(back - (1.0 - p)) / (1.0 - p)
        worst = max(worst, err)
        if 1.0 - (1.0 - p) == p:  # symmetry where 1 - p is exact
            assert ref.norm_ppf(1.0 - p) == pytest.approx(-x, abs=1e-12)
    assert worst < 1e-12


def test_norm_ppf_absolute_accuracy_via_newton_residual():
    # One Newton step against erfc measures the remaining error of x directly.
    for p in np.concatenate([np.logspace(-12, -0.31, 400), 1 - np.logspace(-12, -0.31, 400)]):
        x = ref.norm_ppf(p)
        if p <= 0.5:
            resid = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p
        else:
            resid = -(0.5 * math.erfc(x / math.sqrt(2.0)) - (1.0 - p))
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        assert abs(resid / pdf) < 1e-9


def test_norm_ppf_rejects_out_of_range():
    for p in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            ref.norm_ppf(p)


# ---------------------------------------------------------------------------------------------
# statistical top-k
# ---------------------------------------------------------------------------------------------


def theorem_3_1_bound(d, k, delta=0.01):
    """Bound on |count - k| (in entries, not a fraction) from the paper's Theorem 3.1."""
    assert d >= max(2, math.log(6 / delta))
    frac = 4 * math.sqrt(math.log(6 / delta) / d) * (1 + math.sqrt(-2 * math.log(min(k / d, 1 - k / d))))
    return frac * d


@pytest.mark.parametrize("d,k,typical_abs,bias", [(13824, 1106, 40.0, 6.0), (4096, 256, 20.0, 3.0)])
def test_stat_topk_count_within_theorem_bound(d, k, typical_abs, bias):
    rng = np.random.default_rng(1234 + d)
    bound = theorem_3_1_bound(d, k)
    devs = []
    for _ in range(300):
        x = rng.standard_normal(d) * rng.uniform(0.1, 10.0) + rng.uniform(-5.0, 5.0)
        kept = np.count_nonzero(ref.soft(x, k))
        assert np.count_nonzero(np.isfinite(ref.neg(x, k))) == kept
        devs.append(kept - k)
    devs = np.array(devs, dtype=np.float64)
    assert np.abs(devs).max() <= bound
    # typical behaviour is far tighter than the bound (observed: mean |dev| ~17 and ~9)
    assert np.abs(devs).mean() < typical_abs
    assert abs(devs.mean()) < bias


def test_threshold_formula_matches_definition():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(1000) * 3 + 1
    theta = ref.stat_topk_threshold(x, 80)
    expected = x.mean() + x.std(ddof=1) * ref.norm_ppf(1 - 80 / 1000)
    assert theta == pytest.approx(expected, rel=1e-13, abs=1e-13)
    s = ref.soft(x, 80)
    np.testing.assert_array_equal(s, np.maximum(x - theta, 0.0))
    n = ref.neg(x, 80)
    np.testing.assert_array_equal(n, np.where(x > theta, x, -np.inf))


def test_identity_when_k_at_least_d():
    x = np.array([-3.0, 0.5, 2.0, -0.25])
    for k in (4, 5, 100):
        np.testing.assert_array_equal(ref.soft(x, k), x)
        np.testing.assert_array_equal(ref.neg(x, k), x)


def test_k_zero_is_invalid():
    with pytest.raises(ValueError):
        ref.soft(np.ones(4), 0)
    with pytest.raises(ValueError):
        ref.neg(np.ones(4), 0)


def test_d_equals_two():
    # Q(1 - 1/2) = 0, so theta is the mean
    np.testing.assert_array_equal(ref.soft([1.0, 3.0], 1), [0.0, 1.0])
    np.testing.assert_array_equal(ref.neg([1.0, 3.0], 1), [-np.inf, 3.0])
    np.testing.assert_array_equal(ref.soft([2.0, 2.0], 1), [0.0, 0.0])
    np.testing.assert_array_equal(ref.neg([2.0, 2.0], 1), [2.0, 2.0])


@pytest.mark.parametrize("value", [0.0, 1.0, -3.0, 0.1, 1e-7, 12345.678])
@pytest.mark.parametrize("d", [2, 3, 7, 64, 1000])
def test_constant_rows(value, d):
    x = np.full(d, value)
    for k in range(1, min(d, 5)):
        s = ref.soft(x, k)
        n = ref.neg(x, k)
        assert not np.isnan(s).any() and not np.isnan(n).any()
        # all entries are equal: either all or none exceed theta, and the attention form keeps all
        np.testing.assert_array_equal(n, x)
        assert np.all(s == s[0]) and 0.0 <= s[0] <= 1e-12 * max(1.0, abs(value))
    if value in (0.0, 1.0, -3.0) and d in (2, 64):  # sums and means exact: std is exactly 0
        np.testing.assert_array_equal(ref.soft(x, 1), np.zeros(d))


def test_attention_form_keeps_max_ties_when_nothing_exceeds():
    # All but one entry equal the max: theta = mean + std * Q(1 - 1/d) lands above the max for
    # large d, so nothing exceeds theta and every max entry is kept.
    x = np.full(50, 2.0)
    x[7] = -100.0
    theta = ref.stat_topk_threshold(x, 1)
    assert theta > 2.0
    n = ref.neg(x, 1)
    expected = np.full(50, 2.0)
    expected[7] = -np.inf
    np.testing.assert_array_equal(n, expected)
    np.testing.assert_array_equal(ref.soft(x, 1), np.zeros(50))


def test_never_nan_on_random_and_tied_inputs():
    rng = np.random.default_rng(7)
    for trial in range(2000):
        d = int(rng.integers(2, 60))
        k = int(rng.integers(1, d + 3))
        kind = trial % 3
        if kind == 0:
            x = rng.standard_normal(d) * 10 ** rng.uniform(-6, 6)
        elif kind == 1:
            x = rng.integers(-2, 3, d).astype(np.float64)  # many ties
        else:
            x = np.round(rng.standard_normal(d), 1) + 1e6
        s = ref.soft(x, k)
        n = ref.neg(x, k)
        assert not np.isnan(s).any() and not np.isnan(n).any()
        assert np.isfinite(n).any()
        assert (s >= 0).all() or k >= d


# ---------------------------------------------------------------------------------------------
# FFN: dense formula vs sparse evaluation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("D,F,r_f,k_f", [(64, 256, 32, 20), (48, 500, 16, 7), (32, 64, 8, 64), (32, 64, 8, 1)])
def test_spark_ffn_dense_equals_sparse(D, F, r_f, k_f):
    rng = np.random.default_rng(D * F + k_f)
    k1 = rng.standard_normal((r_f, F)) / math.sqrt(r_f)
    k2 = rng.standard_normal((D - r_f, F)) / math.sqrt(D - r_f)
    v = rng.standard_normal((F, D)) / math.sqrt(F)
    total_active = 0
    for _ in range(20):
        h = rng.standard_normal(D)
        dense, n_active = ref.spark_ffn_dense(h, k1, k2, v, k_f)
        sparse = ref.spark_ffn_sparse(h, k1, k2, v, k_f)
        assert np.max(np.abs(dense - sparse)) <= 1e-12 * max(1.0, np.max(np.abs(dense)))
        assert n_active < F if k_f < F else n_active == F
        total_active += n_active
    assert total_active > 0  # some neurons were active: the comparison was not between zeros


def test_gelu_tanh_values():
    x = np.array([0.0, 1.0, -1.0, 3.0])
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    np.testing.assert_allclose(ref.gelu_tanh(x), 0.5 * x * (1 + np.tanh(inner)), rtol=0, atol=0)
    assert ref.gelu_tanh(np.array([1.0]))[0] == pytest.approx(0.8411919906082768, abs=1e-15)
    assert ref.gelu_tanh(np.array([0.0]))[0] == 0.0


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------


def test_rope_neox_pairs_and_frequencies():
    # width 4, base 10000: pair (0, 2) turns by p, pair (1, 3) by p * 10000^(-1/2)
    e0 = np.array([[1.0, 0.0, 0.0, 0.0]])
    e1 = np.array([[0.0, 1.0, 0.0, 0.0]])
    np.testing.assert_allclose(ref.rope_neox(e0, [1.0], 10000.0), [[math.cos(1), 0, math.sin(1), 0]], atol=1e-15)
    np.testing.assert_allclose(ref.rope_neox(e1, [3.0], 10000.0), [[0, math.cos(0.03), 0, math.sin(0.03)]], atol=1e-15)


def test_rope_relative_positions_and_norm():
    rng = np.random.default_rng(3)
    for m in (2, 8, 10):
        q = rng.standard_normal((1, m))
        k = rng.standard_normal((1, m))
        dots = []
        for p, j in [(5, 2), (13, 10), (103, 100)]:
            rq = ref.rope_neox(q, [p], 10000.0)
            rk = ref.rope_neox(k, [j], 10000.0)
            assert np.linalg.norm(rq) == pytest.approx(np.linalg.norm(q), rel=1e-14)
            dots.append(float((rq * rk).sum()))
        assert dots[0] == pytest.approx(dots[1], abs=1e-12) and dots[0] == pytest.approx(dots[2], abs=1e-12)
        np.testing.assert_allclose(ref.rope_neox(q, [0], 10000.0), q, atol=0)


# ---------------------------------------------------------------------------------------------
# Attention: the loop implementation against a masked, vectorized formulation
# ---------------------------------------------------------------------------------------------


def masked_attention_one_head(q, k, v, cfg, layer):
    """Second formulation of SPEC section 4 attention for one head: q, k [T, H], v [T, H]."""
    T = q.shape[0]
    r_a, k_a, W, cap = cfg["attn_r"], cfg["attn_k"], cfg["sliding_window"], cfg["attn_logit_softcap"]
    p = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    valid = j <= p
    if layer % 2 == 0:
        valid &= j > p - W
    s1 = cap * np.tanh((q[:, :r_a] @ k[:, :r_a].T) / cap)
    s2 = q[:, r_a:] @ k[:, r_a:].T
    count = valid.sum(axis=1)
    s1m = np.where(valid, s1, 0.0)
    mean = s1m.sum(axis=1) / count
    var = np.where(valid, (s1 - mean[:, None]) ** 2, 0.0).sum(axis=1) / np.maximum(count - 1, 1)
    z = np.array([ref.norm_ppf(1 - k_a / c) if c > k_a else -np.inf for c in count])
    theta = np.where(count > k_a, mean + np.sqrt(var) * np.where(np.isfinite(z), z, 0.0), -np.inf)
    keep = valid & (s1 > theta[:, None])
    # a row with nothing above theta keeps its maxima
    rowmax = np.where(valid, s1, -np.inf).max(axis=1)
    empty = ~keep.any(axis=1)
    keep[empty] = valid[empty] & (s1[empty] == rowmax[empty, None])
    logits = np.where(keep, s1, -np.inf)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    w = e / e.sum(axis=1, keepdims=True) * np.log1p(np.exp(s2))
    return w @ v, keep.sum(axis=1)


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_loop_matches_masked_formulation(layer):
    cfg = ckpt.default_tiny_config(head_dim=16, attn_r=8, attn_k=5, sliding_window=12,
                                   n_heads=4, n_kv_heads=2)
    rng = np.random.default_rng(11 + layer)
    T = 40
    q = rng.standard_normal((T, 4, 16)) * 0.8
    k = rng.standard_normal((T, 2, 16)) * 0.8
    v = rng.standard_normal((T, 2, 16))
    counts = []
    o = ref.spark_attention(q, k, v, layer, cfg, counts)
    for n in range(4):
        g = n // 2
        expected, kept = masked_attention_one_head(q[:, n], k[:, g], v[:, g], cfg, layer)
        np.testing.assert_allclose(o[:, n], expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(counts[n * T:(n + 1) * T], kept)


# ---------------------------------------------------------------------------------------------
# Forward pass on tiny checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    cfg = ckpt.default_tiny_config()
    return cfg, ckpt.make_checkpoint(cfg, seed=3)


def tokens_for(cfg, T, seed=0):
    return np.random.default_rng(seed).integers(0, cfg["vocab_size"], T)


def test_forward_finite_capped_and_sparse(tiny):
    cfg, w = tiny
    T = 64  # >= 4 * attn_k
    logits, stats = ref.forward(cfg, w, tokens_for(cfg, T), return_stats=True)
    assert logits.shape == (T, cfg["vocab_size"])
    assert np.isfinite(logits).all()
    assert np.abs(logits).max() <= cfg["final_logit_softcap"]
    assert np.std(logits) > 0.1  # not degenerate
    k_a = cfg["attn_k"]
    for l in range(cfg["n_layers"]):
        # global layers attend to ~k_a positions once the context exceeds k_a
        assert 0.5 * k_a <= stats["attn_attended_full"][l] <= 1.5 * k_a
        assert stats["attn_attended"][l] < 0.5 * (T + 1) / 2  # far below dense causal attention
        frac = stats["ffn_keep_fraction"][l]
        assert 0.5 * cfg["ffn_k"] / cfg["d_ff"] <= frac <= 1.5 * cfg["ffn_k"] / cfg["d_ff"]


def test_forward_final_softcap_engages():
    cfg = ckpt.default_tiny_config(final_logit_softcap=1.5)
    w = ckpt.make_checkpoint(cfg, seed=4)
    logits = ref.forward(cfg, w, tokens_for(cfg, 24))
    assert np.abs(logits).max() <= 1.5
    uncapped = ref.forward(dict(cfg, final_logit_softcap=0.0), w, tokens_for(cfg, 24))
    np.testing.assert_allclose(logits, 1.5 * np.tanh(uncapped / 1.5), rtol=1e-13, atol=1e-13)
    assert np.abs(uncapped).max() > 1.5


def test_forward_causal(tiny):
    cfg, w = tiny
    T = 48
    toks = tokens_for(cfg, T, seed=1)
    base = ref.forward(cfg, w, toks)
    for p in (0, 10, 30):
        changed = toks.copy()
        changed[p + 1:] = (changed[p + 1:] + 17) % cfg["vocab_size"]
        other = ref.forward(cfg, w, changed)
        np.testing.assert_allclose(other[:p + 1], base[:p + 1], rtol=0, atol=1e-12)
        assert np.abs(other[p + 1:] - base[p + 1:]).max() > 1e-3


def test_forward_short_context_is_dense_attention(tiny):
    # positions p < attn_k see |C| <= attn_k in every layer: no selection, so attn_k is irrelevant
    cfg, w = tiny
    T = 30
    toks = tokens_for(cfg, T, seed=2)
    sparse = ref.forward(cfg, w, toks)
    dense = ref.forward(dict(cfg, attn_k=10_000), w, toks)
    k_a = cfg["attn_k"]
    np.testing.assert_allclose(sparse[:k_a], dense[:k_a], rtol=0, atol=1e-12)
    assert np.abs(sparse[k_a:] - dense[k_a:]).max() > 1e-3


def test_forward_sliding_window():
    W = 12
    cfg1 = ckpt.default_tiny_config(n_layers=1, sliding_window=W)  # layer 0 slides
    w1 = ckpt.make_checkpoint(cfg1, seed=5)
    T = 30
    toks = tokens_for(cfg1, T, seed=3)
    changed = toks.copy()
    changed[0] = (changed[0] + 1) % cfg1["vocab_size"]
    a = ref.forward(cfg1, w1, toks)
    b = ref.forward(cfg1, w1, changed)
    # position 0 is outside the window of every p >= W
    np.testing.assert_allclose(a[W:], b[W:], rtol=0, atol=1e-12)
    assert np.abs(a[:W] - b[:W]).max() > 1e-3
    # a wider window makes position 0 visible again
    c = ref.forward(dict(cfg1, sliding_window=T), w1, toks)
    d = ref.forward(dict(cfg1, sliding_window=T), w1, changed)
    assert np.abs(c[W:] - d[W:]).max() > 1e-3
    # with a second (global) layer, the change reaches every later position
    cfg2 = ckpt.default_tiny_config(n_layers=2, sliding_window=W)
    w2 = ckpt.make_checkpoint(cfg2, seed=5)
    e = ref.forward(cfg2, w2, toks)
    f = ref.forward(cfg2, w2, changed)
    assert np.abs(e[W:] - f[W:]).max() > 1e-6


def test_forward_fused_vs_split_k(tiny):
    cfg, w = tiny
    split = ckpt.make_checkpoint(cfg, seed=3, split_k=True)
    assert not any(k.endswith("spark_in") for k in split)
    toks = tokens_for(cfg, 20, seed=4)
    np.testing.assert_array_equal(ref.forward(cfg, w, toks), ref.forward(cfg, split, toks))
    # split by hand from the fused matrix as well
    manual = {k: v for k, v in w.items() if not k.endswith("spark_in")}
    for l in range(cfg["n_layers"]):
        fused = w[f"transformer/layer_{l}/mlp/spark_in"]
        manual[f"transformer/layer_{l}/mlp/spark_k1"] = fused[: cfg["ffn_r"]]
        manual[f"transformer/layer_{l}/mlp/spark_k2"] = fused[cfg["ffn_r"]:]
    np.testing.assert_array_equal(ref.forward(cfg, w, toks), ref.forward(cfg, manual, toks))


def test_forward_ignores_padded_vocab_rows(tiny):
    cfg, _ = tiny
    padded = ckpt.make_checkpoint(cfg, seed=6, vocab_pad=16)
    emb = padded["transformer/embedder/input_embedding"]
    assert emb.shape == (cfg["vocab_size"] + 16, cfg["d_model"])
    sliced = dict(padded)
    sliced["transformer/embedder/input_embedding"] = emb[: cfg["vocab_size"]]
    toks = tokens_for(cfg, 12, seed=5)
    a = ref.forward(cfg, padded, toks)
    assert a.shape == (12, cfg["vocab_size"])
    np.testing.assert_array_equal(a, ref.forward(cfg, sliced, toks))


def test_forward_dense_gemma2_variant(tiny):
    cfg, _ = tiny
    dense = ckpt.make_checkpoint(cfg, seed=7, dense=True)
    toks = tokens_for(cfg, 16, seed=6)
    logits, stats = ref.forward(cfg, dense, toks, return_stats=True)
    assert np.isfinite(logits).all() and np.abs(logits).max() <= cfg["final_logit_softcap"]
    assert min(stats["ffn_keep_fraction"]) > 0.99  # gelu of a dense gate is almost never exactly 0
    # the [2, F, D] layout of Flax Gemma-2 gives the same model
    transposed = dict(dense)
    for l in range(cfg["n_layers"]):
        name = f"transformer/layer_{l}/mlp/gating_einsum"
        transposed[name] = np.swapaxes(dense[name], 1, 2)
    np.testing.assert_allclose(ref.forward(cfg, transposed, toks), logits, rtol=0, atol=1e-12)
    # one layer by hand: gelu_tanh(gate) * up, then down
    rng = np.random.default_rng(0)
    h = rng.standard_normal(cfg["d_model"])
    g = dense["transformer/layer_0/mlp/gating_einsum"].astype(np.float64)
    down = dense["transformer/layer_0/mlp/linear"].astype(np.float64)
    gate, up = h @ g[0], h @ g[1]
    expected = sum(ref.gelu_tanh(gate[j]) * up[j] * down[j] for j in range(cfg["d_ff"]))
    np.testing.assert_allclose(ref.gemma2_ffn_dense(h, g[0], g[1], down), expected, rtol=1e-12, atol=1e-12)


def test_forward_rejects_bad_tokens(tiny):
    cfg, w = tiny
    with pytest.raises(ValueError):
        ref.forward(cfg, w, [0, cfg["vocab_size"]])
    with pytest.raises(ValueError):
        ref.forward(cfg, w, [])


# ---------------------------------------------------------------------------------------------
# The checkpoint generator
# ---------------------------------------------------------------------------------------------


def expected_shapes(cfg, split_k=False, dense=False, vocab_pad=0):
    V, D, L = cfg["vocab_size"], cfg["d_model"], cfg["n_layers"]
    N, KV, H, F, r = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"], cfg["d_ff"], cfg["ffn_r"]
    s = {
        "transformer/embedder/input_embedding": (V + vocab_pad, D),
        "transformer/final_norm/scale": (D,),
    }
    for l in range(L):
        p = f"transformer/layer_{l}/"
        s[p + "pre_attention_norm/scale"] = (D,)
        s[p + "attn/q_einsum/w"] = (N, D, H)
        s[p + "attn/kv_einsum/w"] = (2, KV, D, H)
        s[p + "attn/attn_vec_einsum/w"] = (N, H, D)
        s[p + "post_attention_norm/scale"] = (D,)
        s[p + "pre_ffw_norm/scale"] = (D,)
        if dense:
            s[p + "mlp/gating_einsum"] = (2, D, F)
        elif split_k:
            s[p + "mlp/spark_k1"] = (r, F)
            s[p + "mlp/spark_k2"] = (D - r, F)
        else:
            s[p + "mlp/spark_in"] = (D, F)
        s[p + "mlp/linear"] = (F, D)
        s[p + "post_ffw_norm/scale"] = (D,)
    return s


@pytest.mark.parametrize("split_k,dense,vocab_pad", [(False, False, 0), (True, False, 8), (False, True, 128)])
def test_generator_names_and_shapes(split_k, dense, vocab_pad):
    cfg = ckpt.default_tiny_config(n_layers=3, d_model=48, ffn_r=20)
    arrays = ckpt.make_checkpoint(cfg, seed=1, split_k=split_k, dense=dense, vocab_pad=vocab_pad)
    conf = arrays.pop("config")
    assert conf.dtype.kind == "U" and conf.ndim == 0
    assert json.loads(str(conf[()])) == cfg
    assert set(ckpt.CONFIG_KEYS) <= set(cfg)
    shapes = {k: v.shape for k, v in arrays.items()}
    assert shapes == expected_shapes(cfg, split_k, dense, vocab_pad)
    assert all(v.dtype == np.float32 for v in arrays.values())
    # norm scales small, weights ~ N(0, 1/fan_in)
    assert np.abs(arrays["transformer/final_norm/scale"]).max() < 0.6
    q = arrays["transformer/layer_0/attn/q_einsum/w"]
    assert q.std() == pytest.approx(1 / math.sqrt(cfg["d_model"]), rel=0.1)


def test_generator_default_config():
    cfg = ckpt.default_tiny_config()
    assert cfg["query_pre_attn_scalar"] == cfg["head_dim"]
    assert (cfg["pad_id"], cfg["eos_id"], cfg["bos_id"], cfg["unk_id"]) == (0, 1, 2, 3)
    assert ckpt.default_tiny_config(head_dim=32, attn_r=16)["query_pre_attn_scalar"] == 32
    ckpt.validate_config(cfg)
    for bad in ({"attn_r": 7}, {"ffn_r": 64}, {"n_kv_heads": 3}, {"attn_r": 16}):
        with pytest.raises(ValueError):
            ckpt.validate_config(ckpt.default_tiny_config(**bad))


def test_generator_is_deterministic_per_seed():
    cfg = ckpt.default_tiny_config()
    a, b, c = (ckpt.make_checkpoint(cfg, seed=s) for s in (1, 1, 2))
    name = "transformer/layer_1/mlp/spark_in"
    np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a[name], c[name])


@pytest.mark.parametrize("dtype,compressed", [("float32", False), ("float16", True), ("bfloat16", False),
                                              ("bfloat16", True)])
def test_save_load_round_trip(tmp_path, dtype, compressed):
    cfg = ckpt.default_tiny_config()
    arrays = ckpt.make_checkpoint(cfg, seed=2, split_k=True)
    path = str(tmp_path / "ck.npz")
    tok = bytes(range(256)) * 3
    ckpt.save_checkpoint(path, arrays, dtype=dtype, compressed=compressed, tokenizer_bytes=tok)
    assert os.path.exists(path) and not os.path.exists(path + ".npz")
    with zipfile.ZipFile(path) as zf:
        methods = {i.compress_type for i in zf.infolist()}
    assert methods == ({zipfile.ZIP_DEFLATED} if compressed else {zipfile.ZIP_STORED})
    with np.load(path, allow_pickle=False) as z:
        stored = z["transformer/layer_0/mlp/spark_k1"]
        want = {"float32": "<f4", "float16": "<f2", "bfloat16": "|V2"}[dtype]
        assert stored.dtype.str == want
        assert z["tokenizer"].dtype == np.uint8 and z["tokenizer"].tobytes() == tok
    conf, loaded = ckpt.load_checkpoint(path)
    assert conf.get("dtype") == ("bfloat16" if dtype == "bfloat16" else None)
    assert {k: v for k, v in conf.items() if k != "dtype"} == cfg
    assert "config" not in arrays or json.loads(str(arrays["config"][()])) == cfg  # input untouched
    assert set(loaded) == (set(arrays) - {"config"}) | {"tokenizer"}
    for name, orig in arrays.items():
        if name == "config":
            continue
        assert loaded[name].dtype == np.float64
        np_dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
        np.testing.assert_array_equal(loaded[name], orig.astype(np_dtype).astype(np.float64))
        rel = {"float32": 0, "float16": 2**-11, "bfloat16": 2**-8}[dtype]
        np.testing.assert_allclose(loaded[name], orig, rtol=rel, atol=1e-7 if dtype == "float16" else 0)


def test_bfloat16_checkpoint_forward_close_to_float32(tmp_path):
    cfg = ckpt.default_tiny_config()
    arrays = ckpt.make_checkpoint(cfg, seed=8)
    path = str(tmp_path / "bf.npz")
    ckpt.save_checkpoint(path, arrays, dtype="bfloat16")
    conf, loaded = ckpt.load_checkpoint(path)
    toks = tokens_for(cfg, 8, seed=9)
    a = ref.forward(cfg, arrays, toks)
    b = ref.forward(conf, loaded, toks)
    assert np.abs(a - b).max() < 0.25 and np.abs(a - b).max() > 0  # bf16 noise, not a different model


def test_cli(tmp_path):
    out = str(tmp_path / "cli.npz")
    script = os.path.join(HERE, "spark_checkpoint.py")
    r = subprocess.run([sys.executable, script, out, "--config", '{"n_layers": 3, "vocab_size": 300}',
                        "--seed", "4", "--dtype", "bfloat16", "--split-k", "--compressed", "--vocab-pad", "12"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    conf, loaded = ckpt.load_checkpoint(out)
    assert conf["n_layers"] == 3 and conf["dtype"] == "bfloat16"
    assert loaded["transformer/embedder/input_embedding"].shape == (312, 64)
    assert "transformer/layer_2/mlp/spark_k2" in loaded
    bad = str(tmp_path / "bad.npz")
    r = subprocess.run([sys.executable, script, bad, "--config", '{"n_heads": 3}'], capture_output=True, text=True)
    assert r.returncode != 0 and "n_heads" in r.stderr
    assert not os.path.exists(bad)


# ---------------------------------------------------------------------------------------------
# Extra checks: threshold ties, query scale, and a second vectorized forward
# ---------------------------------------------------------------------------------------------


def test_entries_equal_to_theta_are_dropped():
    # d = 4, k = 2: Q(1/2) = 0 exactly, theta = mean = 2; "exceeds" is strict
    np.testing.assert_array_equal(ref.neg([1.0, 2.0, 2.0, 3.0], 2), [-np.inf, -np.inf, -np.inf, 3.0])
    np.testing.assert_array_equal(ref.soft([1.0, 2.0, 2.0, 3.0], 2), [0.0, 0.0, 0.0, 1.0])


def test_query_scale_is_one_over_sqrt_query_pre_attn_scalar(tiny):
    # scaling Wq by c and query_pre_attn_scalar by c^2 leaves q * scale, hence the model, unchanged
    cfg, w = tiny
    c = 1.7
    scaled = dict(w)
    for l in range(cfg["n_layers"]):
        name = f"transformer/layer_{l}/attn/q_einsum/w"
        scaled[name] = w[name].astype(np.float64) * c
    toks = tokens_for(cfg, 24, seed=8)
    a = ref.forward(cfg, w, toks)
    b = ref.forward(dict(cfg, query_pre_attn_scalar=cfg["query_pre_attn_scalar"] * c * c), scaled, toks)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    assert np.abs(a - ref.forward(cfg, scaled, toks)).max() > 1e-3


def vectorized_forward(cfg, w, toks):
    """SPEC section 4 once more, whole-sequence matrices, sharing only norm_ppf with spark_ref."""
    V, D, N, KV, H = cfg["vocab_size"], cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    r_a, r_f, F, eps = cfg["attn_r"], cfg["ffn_r"], cfg["d_ff"], cfg["rms_norm_eps"]
    T = len(toks)

    def g(name):
        return w[name].astype(np.float64)

    def rms(x, s):
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * (1 + s)

    def rope(x):  # x [T, heads, m]
        m = x.shape[-1]
        ang = np.outer(np.arange(T), cfg["rope_theta"] ** (-np.arange(0, m, 2) / m))[:, None, :]
        a, b = x[..., : m // 2], x[..., m // 2:]
        return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1)

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    E = g("transformer/embedder/input_embedding")[:V]
    x = E[toks] * np.sqrt(D)
    for l in range(cfg["n_layers"]):
        pre = f"transformer/layer_{l}/"
        h = rms(x, g(pre + "pre_attention_norm/scale"))
        q = np.einsum("td,ndh->tnh", h, g(pre + "attn/q_einsum/w"))
        kv = np.einsum("td,cgdh->ctgh", h, g(pre + "attn/kv_einsum/w"))
        q = np.concatenate([rope(q[..., :r_a]), rope(q[..., r_a:])], -1) / np.sqrt(cfg["query_pre_attn_scalar"])
        k = np.concatenate([rope(kv[0][..., :r_a]), rope(kv[0][..., r_a:])], -1)
        o = np.stack([masked_attention_one_head(q[:, n], k[:, n * KV // N], kv[1][:, n * KV // N], cfg, l)[0]
                      for n in range(N)], axis=1)
        x = x + rms(np.einsum("tnh,nhd->td", o, g(pre + "attn/attn_vec_einsum/w")), g(pre + "post_attention_norm/scale"))
        h = rms(x, g(pre + "pre_ffw_norm/scale"))
        K = g(pre + "mlp/spark_in")
        s = h[:, :r_f] @ K[:r_f]
        mean = s.mean(1, keepdims=True)
        std = np.sqrt(((s - mean) ** 2).sum(1, keepdims=True) / (F - 1))
        a = gelu(np.maximum(s - (mean + std * ref.norm_ppf(1 - cfg["ffn_k"] / F)), 0))
        ffn = (a * (h[:, r_f:] @ K[r_f:])) @ g(pre + "mlp/linear")
        x = x + rms(ffn, g(pre + "post_ffw_norm/scale"))
    logits = rms(x, g("transformer/final_norm/scale")) @ E.T
    cap = cfg["final_logit_softcap"]
    return cap * np.tanh(logits / cap)


def test_forward_matches_vectorized_formulation():
    cfg = ckpt.default_tiny_config(n_layers=3, sliding_window=10, attn_k=6)
    w = ckpt.make_checkpoint(cfg, seed=9, vocab_pad=4)
    toks = tokens_for(cfg, 40, seed=10)
    np.testing.assert_allclose(ref.forward(cfg, w, toks), vectorized_forward(cfg, w, toks), rtol=0, atol=1e-9)
