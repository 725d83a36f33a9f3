"""Gemma 3n's sparse FFN layers on the Spark plugin (patch 0015 and
src/models/spark-gemma3n.cpp), against upstream's own gemma3n graph on the same file: the same
upstream tools run the tiny Gemma 3n of tools/gemma3n-synth.py without the plugin (the reference:
every layer dense) and with it (the first 10 FFN layers on spark_ffn_up).

- llama-completion: the same greedy text; the plugin's SPARK_STATS table has one row for each
  of the 10 sparse layers with a keep rate near 1 - Phi(1.6448533535) = 5 %, and none for the
  dense layers or for attention (Gemma 3n's attention stays upstream's).
- llama-perplexity --kl-divergence-base (no plugin) then --kl-divergence (plugin): per-token KL
  divergence of the plugin's distribution from upstream's, and the top-1 agreement.
"""

from __future__ import annotations

import math
import re

import pytest

from gemma3n_helpers import N_LAYER_SPARSE, STD_MUL_KEEP, uh

PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak."]
N_TOKENS = 32


def assert_sparse_layer_stats(res, n_layer: int) -> None:
    """One SPARK_STATS row per sparse layer (0..9), keep rate within 1.5 points of 5 %, no
    attention rows; no row for the dense layers 10.. (they never reach a Spark op)."""
    s = uh.parse_stats(res.stderr)
    assert s.header and not s.none_ran, res.explain("no spark-stats table: did spark_ffn_up run?")
    assert sorted(s.rows) == list(range(min(N_LAYER_SPARSE, n_layer))), res.explain(
        f"spark-stats rows for layers {sorted(s.rows)}, want 0..{N_LAYER_SPARSE - 1} only")
    for layer, row in s.rows.items():
        assert row.tokens > 0, res.explain(f"layer {layer}: ffn_tokens = 0")
        assert abs(row.keep - STD_MUL_KEEP) <= 0.015, res.explain(
            f"layer {layer}: ffn_keep_rate {row.keep} is not within 0.015 of {STD_MUL_KEEP:.4f}")
        assert row.attn_queries == 0, res.explain(f"layer {layer}: a Spark attention row")


@pytest.mark.parametrize("prompt", PROMPTS, ids=["short", "long"])
def test_greedy_text_equals_upstreams_graph(tiny, tiny_meta, prompt):
    """f32 weights. (On q8_0 files the random model's text is not a fair test: ggml quantizes
    the down product's input, a gelu rounding difference moves it by a quantization step now
    and then, and 25 random layers amplify that into another token within 32; the q8_0 test is
    the KL divergence below, against the quantization error itself.)"""
    model = tiny["f32"]
    stock, _ = uh.llama_completion(model, prompt, N_TOKENS, with_plugin=False)
    spark, res = uh.llama_completion(model, prompt, N_TOKENS, with_plugin=True)
    assert stock.strip(), "upstream's graph generated no text"
    assert spark == stock, res.explain(f"plugin text {spark!r} != upstream's {stock!r}")
    assert_sparse_layer_stats(res, tiny_meta["n_layer"])


def test_the_dense_answer_keeps_upstreams_graph(tiny, monkeypatch):
    """SPARK_FFN_DENSE_FROM=1 (spark-backend/src/dense_switch.rs): the Spark backend answers the
    dense path for every ubatch, as on CUDA from 32 tokens, and the sparse layers keep
    upstream's graph: the same text, and no Spark kernel runs."""
    monkeypatch.setenv("SPARK_FFN_DENSE_FROM", "1")
    model = tiny["f32"]
    stock, _ = uh.llama_completion(model, PROMPTS[0], N_TOKENS, with_plugin=False)
    spark, res = uh.llama_completion(model, PROMPTS[0], N_TOKENS, with_plugin=True)
    assert spark == stock, res.explain(f"plugin text {spark!r} != upstream's {stock!r}")
    assert uh.parse_stats(res.stderr).none_ran, res.explain("a Spark kernel ran on the dense answer")


def test_without_the_plugin_no_spark_op_runs(tiny):
    """Stock tools print no table even with SPARK_STATS=1: nothing of the plugin is there."""
    _, res = uh.llama_completion(tiny["f32"], PROMPTS[0], 8, with_plugin=False)
    assert not uh.parse_stats(res.stderr).lines, res.explain("spark-stats lines without the plugin")


CTX, CHUNKS = "128", "4"


def kld_run(model, base, with_plugin: bool):
    """llama-perplexity --kl-divergence of `model` against the base log-probabilities `base`."""
    return uh.llama_perplexity(model, "-c", CTX, "-b", CTX, "--kl-divergence-base", base,
                               "--kl-divergence", with_plugin=with_plugin)


def figures(res) -> tuple[float, float, float]:
    """Mean KLD, its 99th percentile and the top-1 agreement (%) of a --kl-divergence run."""
    return uh.stat(res, "Mean    KLD"), uh.stat(res, "99.0%   KLD"), uh.stat(res, "Same top p")


@pytest.fixture(scope="module")
def kld_base(tmp_path_factory):
    """Upstream's graph (no plugin): the base log-probabilities of a model file, made once."""
    bases = {}

    def get(model):
        if model not in bases:
            base = tmp_path_factory.mktemp("kld") / f"{model.stem}.kld"
            res = uh.llama_perplexity(model, "-f", uh.HELDOUT, "-c", CTX, "--chunks", CHUNKS,
                                      "--kl-divergence-base", base, with_plugin=False)
            assert base.is_file() and base.stat().st_size > 0, res.explain(f"{base} not written")
            bases[model] = base
        return bases[model]
    return get


def test_f32_kl_divergence_from_upstreams_graph(tiny, tiny_meta, kld_base):
    """f32 weights: the plugin's distribution against upstream's graph on the same file. What
    differs is the gelu: upstream's CPU gelu looks its input up rounded to f16 (GGML_GELU_FP16),
    the op computes gelu_tanh in f32 (up to ~5e-4 relative on each kept activation)."""
    res = kld_run(tiny["f32"], kld_base(tiny["f32"]), with_plugin=True)
    mean, p99, top = figures(res)
    print(f"\nf32, plugin vs upstream: mean KLD {mean:.2e}, 99% {p99:.2e}, same top {top} %")
    assert mean <= 1e-4 and p99 <= 1e-3 and top >= 97.0, res.stdout
    assert_sparse_layer_stats(res, tiny_meta["n_layer"])


# Upstream's own rounding error on the tiny-calm files against their f32 file (mean KLD),
# measured 1.3e-3 (q8_0) and 1.8e-4 (bf16) on x86 with and without AVX-512 (2026-12-06); the
# bound is ~4x. Far above it, upstream's graph is broken on this machine, not the plugin (AMX
# gave 7.5 before patch 0018).
CALM_ROUNDING_BOUND = {"q8_0": 5e-3, "bf16": 1e-3}


@pytest.mark.parametrize("outtype", ["q8_0", "bf16"])
def test_stays_within_upstreams_rounding_error(calm, tiny_meta, kld_base, outtype):
    """q8_0 and bf16 weights, on the tiny-calm model (tiny's 25 random layers turn q8_0
    rounding alone into KLD 0.065 and 20 % changed top tokens, so their distances say little):
    ggml rounds each matrix product's input to the weights' dot type (q8_0 blocks, bf16),
    upstream's up and down products included, where the op multiplies f32 activations (and its
    gelu differs by rounding, above), and the neuron-major down copy is f16. So the plugin's
    distribution is compared with upstream's on the same file, and both with upstream's f32
    model of the same seed (the rounding error itself). Measured (2026-12-06, AMD EPYC):
    upstream 1.32e-3 / 1.81e-4 (q8_0 / bf16), the plugin 1.50e-3 / 2.00e-4 (1.13x / 1.10x),
    plugin vs upstream on the file 8.0e-4 / 6.2e-5 (0.61x / 0.34x of the rounding error).
    Bounds: the plugin within 1.3x of upstream's error and 2 points of its top-1 agreement,
    and within 0.75x of that error of upstream's own distribution."""
    model, base_f32 = calm[outtype], kld_base(calm["f32"])
    stock = kld_run(model, base_f32, with_plugin=False)
    stock_err = figures(stock)
    res = kld_run(model, base_f32, with_plugin=True)
    spark_err = figures(res)
    direct = figures(kld_run(model, kld_base(model), with_plugin=True))
    print(f"\n{outtype} vs upstream f32: upstream mean KLD {stock_err[0]:.2e} (same top {stock_err[2]} %), "
          f"plugin {spark_err[0]:.2e} ({spark_err[2]} %); plugin vs upstream {outtype}: {direct[0]:.2e} "
          f"(99% {direct[1]:.2e}, same top {direct[2]} %)")
    assert stock_err[0] <= CALM_ROUNDING_BOUND[outtype], stock.explain(
        f"upstream's own graph is {stock_err[0]:.3g} from f32 on {outtype} (its rounding: about "
        f"{CALM_ROUNDING_BOUND[outtype] / 4:g}): ggml computes wrong on this machine; compare -nr "
        "(docs/USAGE.md, 'Intel CPUs with AMX')")
    assert spark_err[0] <= 1.3 * stock_err[0], res.stdout
    assert spark_err[2] >= stock_err[2] - 2.0, res.stdout
    assert direct[0] <= 0.75 * stock_err[0], (direct, stock_err)
    assert_sparse_layer_stats(res, tiny_meta["n_layer"])


@pytest.mark.parametrize("ub", ["512", "1", "17"])
@pytest.mark.parametrize("with_plugin", [False, True], ids=["upstream", "plugin"])
def test_extra_buffers_agree_with_plain(calm, with_plugin, ub, tmp_path):
    """The tiny-calm q8_0 file, whose 3-D altup_proj / altup_unembd_proj are Q8_0 too, with the
    extra CPU buffer types (AMX on Xeons with AMX_INT8) against -nr, as
    tests/python/upstream/test_extra_buffers.py does for Gemma-2 files; skipped, saying so, where
    no extra type takes a q8_0 weight (x86 without AMX). Bound mean KLD 1.5e-3, same top 97 %:
    ggml's AMX code on software tiles (tools/amx-check.sh --emulate, patch 0018) measured
    6.9-8.4e-4 and 98.8-99.6 % at -ub 512, 1 and 17; before patch 0018, 7.6 and NaN. Each AMX
    product agrees with the plain one to 3e-6 of its rms; the model spreads such differences
    by flipping the q8_0 rounding of the next product's inputs now and then: ggml's own plain
    kernels differ as much from each other (-nr -ub 1 or 17 against -nr -ub 512 on this file:
    8.1-8.4e-4)."""
    res, extra = uh.extra_buffers_vs_plain(calm["q8_0"], tmp_path, ub, "-f", uh.HELDOUT, "-c",
                                           CTX, "--chunks", CHUNKS, with_plugin=with_plugin)
    uh.assert_extra_buffers_agree(res, extra, 1.5e-3, 97.0,
                                  f"gemma3n tiny-calm q8_0 {'plugin' if with_plugin else 'upstream'} -ub {ub}")


@pytest.mark.parametrize("v_type, stored", [(None, "f16"), ("f16", "f16"), ("bf16", "bf16"),
                                            ("f32", "f32"), ("q8_0", "q8_0"), ("file", "f32"),
                                            ("q4_k", "f16")])
def test_neuron_major_down_type(tiny, tiny_meta, v_type, stored):
    """The neuron-major copy of the sparse layers' ffn_down made at load, in the type
    SPARK_GEMMA3N_V_TYPE names (default f16; "file": the file's type, f32 here; an unknown name:
    one warning naming it, then f16): the load log names the type and the size, and the text is
    upstream's (f32 file; the tiny model's text holds for every storage type)."""
    env = uh.tool_env(with_plugin=True)
    env.pop("SPARK_GEMMA3N_V_TYPE", None)
    if v_type is not None:
        env["SPARK_GEMMA3N_V_TYPE"] = v_type
    cmd = [uh.tool("llama-completion"), "-m", tiny["f32"], "-p", PROMPTS[0], "-n", N_TOKENS,
           "--temp", "0", "--seed", uh.SEED, "-t", uh.THREADS, "-no-cnv", "--no-display-prompt",
           "--no-warmup", "-v"]
    res = uh.run_until_complete(cmd, lambda r: r.stdout.endswith(uh.COMPLETION_END), env=env)
    n_ff, n_embd = tiny_meta["n_ff"], tiny_meta["n_embd"]
    bytes_per = {"f16": 2, "bf16": 2, "f32": 4, "q8_0": 34 / 32}[stored]
    mib = N_LAYER_SPARSE * n_ff * n_embd * bytes_per / 2**20
    want = f"neuron-major ffn_down of layers 0-9 ({stored}), {mib:.2f} MiB in CPU"
    assert want in res.stderr, res.explain(f"no '{want}' in the load log")
    warned = "SPARK_GEMMA3N_V_TYPE=q4_k is not one of" in res.stderr
    assert warned == (v_type == "q4_k"), res.explain("the warning for an unknown type")
    stock, _ = uh.llama_completion(tiny["f32"], PROMPTS[0], N_TOKENS, with_plugin=False)
    assert uh.completion_text(res.stdout) == stock, res.explain("text differs from upstream's")
    assert_sparse_layer_stats(res, tiny_meta["n_layer"])


HOST_ROW = re.compile(r"common_memory_breakdown_print: \|\s+- Host\s+\|\s+(\d+) =\s+(\d+) \+")


def host_model_mib(model, with_plugin: bool) -> tuple[list[int], object]:
    """llama-completion -v's memory tables (the memory-fit pass's, then the one at exit): the
    host's model MiB of each."""
    env = uh.tool_env(with_plugin=with_plugin)
    env["SPARK_GEMMA3N_V_TYPE"] = "f32"
    cmd = [uh.tool("llama-completion"), "-m", model, "-p", PROMPTS[0], "-n", "4", "--temp", "0",
           "-t", uh.THREADS, "-no-cnv", "--no-warmup", "-v"]
    # the table at exit is the last thing printed, through llama.cpp's log thread, which an exit
    # can outrun (seen once in CI: the fit pass's table only): a run without both is run again
    def complete(r) -> bool:
        return r.stdout.endswith(uh.COMPLETION_END) and len(HOST_ROW.findall(r.stderr)) >= 2

    res = uh.run_until_complete(cmd, complete, env=env)
    return [int(m[2]) for m in HOST_ROW.finditer(res.stderr)], res


def test_memory_breakdown_counts_the_copy(tiny, tiny_meta):
    """The neuron-major copy is model memory llama.cpp knows of (patch 0016): the memory-fit
    pass (`--fit`, on by default; it loads with no_alloc) and the table at exit both count it,
    as whole MiB: the f32 copy of the tiny model is 10 x n_ff x n_embd x 4 bytes."""
    stock, _ = host_model_mib(tiny["f32"], with_plugin=False)
    spark, res = host_model_mib(tiny["f32"], with_plugin=True)
    copy_mib = N_LAYER_SPARSE * tiny_meta["n_ff"] * tiny_meta["n_embd"] * 4 / 2**20
    assert len(stock) == 2 and len(spark) == 2, res.explain(
        f"want two memory tables (fit pass, exit) each; got {stock} without, {spark} with")
    for when, s, p in zip(("fit pass", "exit"), stock, spark):
        assert math.floor(copy_mib) <= p - s <= math.ceil(copy_mib), res.explain(
            f"{when}: host model memory {p} MiB with the plugin, {s} without: the "
            f"{copy_mib:.2f} MiB copy is not counted")
