"""llama-perplexity with the Spark plugin on the shipped model: the same perplexity as `spark
perplexity` (both print llama-perplexity's "Final estimate" with 4 decimals), and its KL
divergence pair (--kl-divergence-base, then --kl-divergence): ~0 for the model against itself,
small and positive for llama-quantize's Q8_0 and Q4_K_M."""

from __future__ import annotations

import re

import pytest

from upstream_helpers import (CFG, EVAL, HELDOUT, TARGET_KEEP, THREADS, assert_stats_table,
                              final_ppl, llama_perplexity, parse_stats, spark_cli, stat)

SLICE = EVAL["slice_first_8_chunks"]  # n_ctx 256, 8 chunks: what tests/python/model scores
CTX, CHUNKS = str(SLICE["n_ctx"]), str(SLICE["n_chunks"])


@pytest.fixture(scope="module")
def spark_ppl(shipped_f32) -> str:
    """`spark perplexity`: one chunk (256 tokens) per batch, f16 KV cache, Spark kernels."""
    res = spark_cli("perplexity", "-m", shipped_f32, "-f", HELDOUT, "-c", CTX, "--chunks", CHUNKS,
                    "-t", THREADS, timeout=300)
    return final_ppl(res)


@pytest.mark.parametrize("batch", ["256", "2048"])
def test_llama_perplexity_reproduces_spark_perplexity(shipped_f32, spark_ppl, batch):
    """-b 256: one chunk per batch, as `spark perplexity` runs. -b 2048 (llama-perplexity's
    default): 8 chunks per batch as 8 sequences (8 KV streams, ubatches of 512 tokens holding 2
    sequences each); each token's result does not depend on its batch, so the same figure."""
    res = llama_perplexity(shipped_f32, "-f", HELDOUT, "-c", CTX, "--chunks", CHUNKS, "-b", batch)
    got = final_ppl(res)
    print(f"\nllama-perplexity -b {batch}: PPL = {got}; spark perplexity: {spark_ppl}; "
          f"training framework: {SLICE['ppl']:.4f}")
    # the training framework's figure (float32 PyTorch) to 1 %, as tests/python/model asserts
    assert abs(float(got) - SLICE["ppl"]) / SLICE["ppl"] <= 0.01, (got, SLICE["ppl"])
    # every token through the sparse kernels (this explains a different figure, if any)
    assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, explain=lambda what: res.explain(
        f"{what}\nllama-perplexity -b {batch}: PPL {got}; spark perplexity: {spark_ppl}"))
    assert got == spark_ppl, res.explain(f"llama-perplexity -b {batch}: PPL {got}, "
                                         f"spark perplexity: {spark_ppl}")


def test_llama_perplexity_dense_graph_is_close(shipped_f32, spark_ppl):
    """Without the plugin the same model runs on the dense stock-op graph (the same math from
    stock ops over all neurons and positions, rounding differently): within 0.5 % of the sparse
    figure, as tests/python/model asserts for `spark perplexity --dense`."""
    res = llama_perplexity(shipped_f32, "-f", HELDOUT, "-c", CTX, "--chunks", CHUNKS, "-b", "256",
                           with_plugin=False)
    dense = float(final_ppl(res))
    assert "spark-stats" not in res.stderr, res.explain("spark-stats without the plugin")
    assert abs(dense - float(spark_ppl)) / dense <= 0.005, (dense, spark_ppl)
    print(f"\ndense graph: PPL = {dense:.4f}; sparse: {spark_ppl}")


@pytest.fixture(scope="module")
def kld_base(shipped_f32, tmp_path_factory):
    base = tmp_path_factory.mktemp("kld") / "spark-f32.kld"
    res = llama_perplexity(shipped_f32, "-f", HELDOUT, "-c", CTX, "--chunks", CHUNKS, "-b", "256",
                           "--kl-divergence-base", base)
    assert base.is_file() and base.stat().st_size > 0, res.explain(f"{base} not written")
    return base, float(final_ppl(res))


def kl_divergence(model, base, *extra, env: dict | None = None):
    return llama_perplexity(model, "-c", CTX, "-b", "256", "--kl-divergence-base", base,
                            "--kl-divergence", *extra, env=env)


def test_kl_divergence_of_the_model_with_itself_is_zero(shipped_f32, kld_base):
    base, ppl = kld_base
    res = kl_divergence(shipped_f32, base)
    # the base file holds log-probabilities rounded to 16 bits per token, hence not exactly 0
    assert stat(res, "Mean    KLD") <= 1e-4, res.stdout
    assert stat(res, "Maximum KLD") <= 1e-3, res.stdout
    assert stat(res, "Same top p") == pytest.approx(100.0), res.stdout
    assert stat(res, "Mean PPL(Q)") == pytest.approx(ppl, rel=1e-4), res.stdout
    print(f"\nself: Mean KLD {stat(res, 'Mean    KLD'):.6f}, "
          f"max {stat(res, 'Maximum KLD'):.6f}, PPL(Q) {stat(res, 'Mean PPL(Q)'):.4f}")


@pytest.mark.parametrize("qtype, max_kld", [("Q8_0", 0.01), ("Q4_K_M", 0.2)])
def test_kl_divergence_of_quantized_models(shipped_quantized, kld_base, qtype, max_kld):
    base, ppl = kld_base
    res = kl_divergence(shipped_quantized(qtype), base)
    kld = stat(res, "Mean    KLD")
    assert 0 < kld <= max_kld, res.stdout
    assert stat(res, "Mean PPL(base)") == pytest.approx(ppl, rel=1e-4), res.stdout
    assert stat(res, "Same top p") >= 80.0, res.stdout
    assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, tol=0.02, explain=res.explain)
    print(f"\n{qtype}: Mean KLD {kld:.6f}, PPL(Q) {stat(res, 'Mean PPL(Q)'):.4f}, "
          f"PPL(base) {stat(res, 'Mean PPL(base)'):.4f}, same top p {stat(res, 'Same top p')} %")


@pytest.mark.parametrize("with_plugin", [True, False], ids=["plugin", "dense"])
def test_bf16_runs_in_multi_sequence_batches(shipped_quantized, spark_ppl, with_plugin):
    """BF16 weights, llama-perplexity's default batch (8 sequences): llama.cpp also reserves a
    graph of no tokens, which once took the dense FFN graph even with the plugin, and ggml-cpu's
    out_prod takes no bf16 weights, so the scheduler aborted ("GGML_ASSERT(*cur_backend_id !=
    -1)", found on the GPU machine's CPU baseline). With the plugin every graph holds the sparse
    nodes (no dense-graph warning); without it the dense graph casts the bf16 V to f32."""
    model = shipped_quantized("BF16")
    res = llama_perplexity(model, "-f", HELDOUT, "-c", CTX, "--chunks", CHUNKS,
                           with_plugin=with_plugin)
    got = float(final_ppl(res))
    assert "runs on the dense graph" not in res.stderr, res.explain("dense-graph warning")
    # bf16 rounds the weights: within 0.5 % of the f32 model's sparse figure, either graph
    assert abs(got - float(spark_ppl)) / got <= 0.005, res.explain(f"PPL {got} vs f32 {spark_ppl}")
    print(f"\nBF16, -b 2048, {'plugin' if with_plugin else 'dense graph'}: PPL = {got:.4f}; "
          f"f32 sparse: {spark_ppl}")


# The switch points of spark-backend/src/dense_switch.rs moved to 1 token for every backend: the
# Spark backend answers the dense path (SPARK_FFN_PATH_DENSE, SPARK_ATTN_PATH_DENSE) for every
# ubatch, as it does on CUDA for ubatches from 32 tokens, and the graph runs the FFN and attention
# on stock ops with V's product as a matrix product over V copied to stock layout (f32 stays
# f32; q8_0 rows dequantized by a get_rows of every neuron, then f16): what a GPU runs, here on
# the CPU.
DENSE_FROM_1 = {"SPARK_FFN_DENSE_FROM": "1", "SPARK_ATTN_DENSE_FROM": "1"}


@pytest.mark.parametrize("qtype, max_kld", [("F32", 1e-4), ("Q8_0", 0.01)])
def test_the_dense_answer_runs_stock_matrix_products_and_matches(shipped_f32, shipped_quantized,
                                                                 kld_base, qtype, max_kld):
    """Against the sparse f32 run's log-probabilities (kld_base): F32 (V's copy stays f32) within
    the bound of the model against itself, Q8_0 (V dequantized, then copied in f16) within the
    bound of test_kl_divergence_of_quantized_models.
    No Spark kernel runs, no node is an OUT_PROD (the form ggml-cuda cannot run on quantized
    V), and each layer's FFN output ("ffn_out-<il>", the graph's last name for it) is a MUL_MAT
    (GGML_SCHED_DEBUG=2 prints every node at -v)."""
    base, _ = kld_base
    model = shipped_f32 if qtype == "F32" else shipped_quantized(qtype)
    res = kl_divergence(model, base, "-v", env={**DENSE_FROM_1, "GGML_SCHED_DEBUG": "2"})
    kld = stat(res, "Mean    KLD")
    print(f"\n{qtype}, dense answer: Mean KLD {kld:.6f}, same top p {stat(res, 'Same top p')} %, "
          f"PPL(Q) {stat(res, 'Mean PPL(Q)'):.4f}")
    assert kld <= max_kld, res.stdout
    assert stat(res, "Same top p") >= (99.0 if qtype == "F32" else 80.0), res.stdout
    assert parse_stats(res.stderr).none_ran, res.explain("Spark kernels ran on the dense answer")
    # "node #  12 (   MUL_MAT):            ffn_out-0 (...": (op, name) of every node
    nodes = set(re.findall(r"node #\s*\d+ \(\s*(\S+)\):\s+(\S+)", res.stderr))
    assert nodes, res.explain("no node lines from GGML_SCHED_DEBUG=2")
    ops = {op for op, _ in nodes}
    assert "OUT_PROD" not in ops, res.explain("an OUT_PROD node in the graph")
    outputs = {name for op, name in nodes if op == "MUL_MAT" and name.startswith("ffn_out-")}
    want = {f"ffn_out-{il}" for il in range(CFG["n_layers"])}
    assert outputs == want, res.explain(f"MUL_MAT FFN outputs {sorted(outputs)}")
    if qtype == "Q8_0":
        assert "GET_ROWS" in ops, res.explain("q8_0 V not dequantized by a get_rows")
