"""llama-completion (upstream llama.cpp's plain completion tool) on the shipped Spark model: the
Spark kernels load as a ggml backend plugin through GGML_BACKEND_PATH and run under every layer
(the plugin's SPARK_STATS=1 table), nothing of them runs without it, the greedy text is the
`spark run` text, and llama.cpp's own --override-kv turns the k dial.

A plugin that refuses a foreign ggml cannot be produced from here (it needs a second llama.cpp
build); the Rust unit tests of spark-backend/src/plugin.rs cover the refusal."""

from __future__ import annotations

import pytest

from upstream_helpers import (CFG, TARGET_KEEP, assert_k_dial, assert_stats_table, llama_completion,
                              parse_stats, spark_run_text)

PROMPTS = ["ROMEO:", "JULIET.\nO Romeo, Romeo, wherefore"]
N_PREDICT = 32
SMALL_K = 41  # half of the shipped model's k_f = 82


@pytest.fixture(scope="module")
def sparse_runs(shipped_f32):
    """prompt -> (text, Result) of llama-completion with the plugin and SPARK_STATS=1."""
    return {p: llama_completion(shipped_f32, p, N_PREDICT, True) for p in PROMPTS}


def test_plugin_runs_the_sparse_kernels_in_every_layer(sparse_runs):
    for prompt, (text, res) in sparse_runs.items():
        assert text.strip(), res.explain(f"no text generated for {prompt!r}")
        # every layer's sparse FFN ran, keeping about k_f/F of the neurons (trained model:
        # 0.073..0.082 per layer over the held-out text; same tolerance as tests/python/model),
        # and its sparse attention kernel on every token
        stats = assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, explain=res.explain)
        print(f"\n{prompt!r} -> {text!r}\n" + "\n".join(stats.lines))


def test_without_the_plugin_no_spark_kernel_runs(shipped_f32, sparse_runs):
    for prompt, (sparse_text, _) in sparse_runs.items():
        dense_text, res = llama_completion(shipped_f32, prompt, N_PREDICT, False)
        assert dense_text.strip(), res.explain(f"no text generated for {prompt!r}")
        stats = parse_stats(res.stderr)
        # SPARK_STATS=1 is set, but nothing of the plugin is in the process
        assert not stats.lines, res.explain(f"spark-stats lines without GGML_BACKEND_PATH: "
                                            f"{stats.lines}")
        # information only: the dense stock-op graph computes the same statistical top-k from
        # stock ops over all F neurons and all positions (dropped ones zeroed, not skipped), so
        # it rounds differently and its greedy text may part from the sparse one at some point
        same = "the same" if dense_text == sparse_text else "different"
        print(f"\n{prompt!r}: dense-graph text is {same}\n  sparse: {sparse_text!r}\n"
              f"  dense:  {dense_text!r}")


def test_greedy_text_is_the_spark_run_text(shipped_f32, sparse_runs):
    """Both tools tokenize the prompt with llama_tokenize (BOS added; llama-completion parses
    special tokens, `spark run` does not: the same for these plain-text prompts), decode the
    prompt in one batch and then one token at a time, with an f16 KV cache, and sample the
    argmax (temperature 0). So the texts are equal, and so are the kernels' statistics: the same
    tokens went through the same kernels (the KV cache sizes differ, `spark run` sizes it to
    prompt + n, llama-completion to the model's 256; masked positions do not count)."""
    for prompt, (text, res) in sparse_runs.items():
        want, spark_res = spark_run_text(shipped_f32, prompt, N_PREDICT, "--spark-stats")
        assert text == want, (f"{prompt!r}: llama-completion with the plugin gave\n  {text!r}\n"
                              f"`spark run` gave\n  {want!r}\n{res.command}\n{spark_res.command}")
        ours = parse_stats(spark_res.stderr).rows
        theirs = parse_stats(res.stderr).rows
        assert theirs == ours, (f"{prompt!r}: per-layer statistics differ\n llama-completion: "
                                f"{theirs}\n spark run: {ours}")


def test_override_kv_ffn_k_is_the_k_dial(shipped_f32, sparse_runs):
    prompt = PROMPTS[0]
    _, base = sparse_runs[prompt]
    text, res = llama_completion(shipped_f32, prompt, N_PREDICT, True, "--override-kv",
                                 f"spark-gemma2.spark.ffn_k=int:{SMALL_K}")
    assert text.strip(), res.explain("no text generated")
    assert_k_dial(res, text, base.stderr, shipped_f32, prompt, N_PREDICT, SMALL_K)
