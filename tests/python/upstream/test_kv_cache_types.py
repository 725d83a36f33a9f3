"""Quantized KV caches (issue 56) through the doors people pass them to: the flags llama.cpp users
give every model (`-fa on -ctk q8_0 -ctv q8_0`, or q4_0) on the shipped Spark model (heads of 64
dims, r_a 32: whole blocks of 32), with the plugin.

- llama-completion: flash attention on is a warning, never a refusal (spark-gemma2 runs its own
  sparse attention on the cache), every layer goes through the Spark kernels, the greedy text is
  `spark run --cache-type`'s, and the cache's memory is that of the type (llama.cpp's own line).
- llama-perplexity: the sparse kernels and the dense stock-op graph read the same quantized
  cache (KL divergence against each other), and the perplexity stays near the f16 cache's.
- llama-cli, llama-bench, llama-batched-bench, llama-server and `spark bench` run with the same
  flags (llama-cpp-python: test_python.py; an rpc-server with the plugin, whose Spark ops read
  the cache it holds: test_rpc.py).

The logits of every cache type against the float64 reference are
tests/python/integration/test_spark_eval.py's; the kernels' bits against an f32 cache of the
same values spark-backend/tests/attention.rs's."""

from __future__ import annotations

import json
import re

import pytest

from upstream_helpers import (CFG, HELDOUT, TARGET_KEEP, THREADS, Server, assert_stats_table,
                              llama_completion, llama_perplexity, parse_stats, run, spark_cli,
                              spark_run_text, stat, tool, tool_env)

PROMPT = "ROMEO:"
N_PREDICT = 24
CACHES = ["q8_0", "q4_0"]
FA_WARNING = "forcing off (its own sparse attention runs)"


def cache_flags(cache: str) -> list[str]:
    return ["-fa", "on", "-ctk", cache, "-ctv", cache]


def kv_cache_mib(stderr: str) -> tuple[str, float, str, float]:
    """(K type, K MiB, V type, V MiB) from llama.cpp's `llama_kv_cache: size = ...` line (the
    first: the full-attention layers' cache; an info line, printed at -lv 4)."""
    m = re.search(r"llama_kv_cache: size = .*K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB",
                  stderr)
    assert m, f"no llama_kv_cache size line in:\n{stderr[-3000:]}"
    return m[1], float(m[2]), m[3], float(m[4])


@pytest.fixture(scope="module")
def f16_run(shipped_f32):
    return llama_completion(shipped_f32, PROMPT, N_PREDICT, True, "-lv", "4")


@pytest.mark.parametrize("cache", CACHES)
def test_llama_completion_runs_the_sparse_kernels_on_a_quantized_cache(shipped_f32, f16_run, cache):
    text, res = llama_completion(shipped_f32, PROMPT, N_PREDICT, True, *cache_flags(cache), "-lv", "4")
    assert text.strip(), res.explain("no text")
    assert FA_WARNING in res.stderr, res.explain("no warning that flash attention is off")
    assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, explain=res.explain)
    want, spark_res = spark_run_text(shipped_f32, PROMPT, N_PREDICT, "--cache-type", cache)
    assert text == want, (f"llama-completion {cache_flags(cache)} gave\n  {text!r}\n`spark run "
                          f"--cache-type {cache}` gave\n  {want!r}\n{res.command}\n{spark_res.command}")
    # the cache holds the type's bytes: q8_0 34 bytes per 32 values, q4_0 18, f16 64 (llama.cpp
    # prints MiB to two decimals: the shipped model's caches are ~0.2 MiB in f16)
    k_ty, k_mib, v_ty, v_mib = kv_cache_mib(res.stderr)
    _, k16, _, v16 = kv_cache_mib(f16_run[1].stderr)
    per_block = {"q8_0": 34, "q4_0": 18}[cache]
    assert (k_ty, v_ty) == (cache, cache), res.stderr
    assert k_mib == pytest.approx(k16 * per_block / 64, abs=0.006), (k_mib, k16)
    assert v_mib == pytest.approx(v16 * per_block / 64, abs=0.006), (v_mib, v16)
    print(f"\n{cache}: {text!r}\n  K {k_mib} MiB, V {v_mib} MiB (f16: {k16}, {v16}); f16 text "
          f"{'the same' if text == f16_run[0] else 'different'}")


PPL_ARGS = ["-c", "256", "-b", "256", "--chunks", "4", "-t", THREADS]


@pytest.fixture(scope="module")
def perplexities(shipped_f32, tmp_path_factory):
    """cache -> (ppl, Result) of llama-perplexity with the plugin over the held-out text."""
    out = {}
    for cache in ["f16", *CACHES]:
        flags = [] if cache == "f16" else cache_flags(cache)
        res = llama_perplexity(shipped_f32, *PPL_ARGS, "-f", HELDOUT, *flags)
        out[cache] = (float(re.search(r"Final estimate: PPL = ([\d.]+)", res.stdout + res.stderr)[1]), res)
    return out


# Perplexity of the shipped model over 4 chunks of held-out text (measured: f16 49.80, q8_0
# 49.80 (-0.01 %), q4_0 50.26 (+0.93 %)): a quantized cache may cost a little quality, not a lot.
PPL_REL = {"q8_0": 0.005, "q4_0": 0.03}


@pytest.mark.parametrize("cache", CACHES)
def test_perplexity_with_a_quantized_cache_stays_near_f16(perplexities, cache):
    ppl16 = perplexities["f16"][0]
    ppl, res = perplexities[cache]
    print(f"\nPPL f16 {ppl16:.4f}, {cache} {ppl:.4f} ({(ppl / ppl16 - 1) * 100:+.2f} %)")
    assert ppl == pytest.approx(ppl16, rel=PPL_REL[cache]), res.stdout[-2000:]


def test_sparse_kernels_and_dense_graph_read_the_same_q8_0_cache(shipped_f32, tmp_path):
    """The dense stock-op graph (no plugin) on a q8_0 cache as the base, the plugin's sparse
    kernels against it: the model against itself across its two paths (test_perplexity.py's
    f16-cache bound between them is 2e-3 mean KLD)."""
    base = tmp_path / "dense-q8_0.kld"
    llama_perplexity(shipped_f32, *PPL_ARGS, "-f", HELDOUT, *cache_flags("q8_0"),
                     "--kl-divergence-base", base, with_plugin=False)
    res = llama_perplexity(shipped_f32, *PPL_ARGS, *cache_flags("q8_0"), "--kl-divergence-base", base,
                           "--kl-divergence")
    print(f"\nq8_0 cache, sparse vs dense graph: mean KLD {stat(res, 'Mean    KLD')}, same top "
          f"{stat(res, 'Same top p')} %")
    assert stat(res, "Mean    KLD") <= 2e-3, res.stdout
    assert stat(res, "Same top p") >= 98.0, res.stdout


def test_llama_bench_and_batched_bench_take_the_flags(shipped_f32):
    md = run([tool("llama-bench"), "-m", shipped_f32, "-p", "32", "-n", "8", "-r", "1", "-t", THREADS,
              "-fa", "1", "-ctk", "q8_0", "-ctv", "q8_0", "-o", "json"], env=tool_env(True), timeout=300)
    records = json.loads(md.stdout)
    assert {(r["type_k"], r["type_v"]) for r in records} == {("q8_0", "q8_0")}, records
    assert all(r["avg_ts"] > 0 for r in records), records
    assert parse_stats(md.stderr).rows, md.explain("no spark-stats: the kernels did not run")

    bb = run([tool("llama-batched-bench"), "-m", shipped_f32, "-c", "512", "-npp", "32", "-ntg", "8",
              "-npl", "1,2", "-t", THREADS, *cache_flags("q8_0")], env=tool_env(True), timeout=300)
    rows = [line for line in bb.stdout.splitlines() if re.match(r"\|\s+\d+", line)]
    assert len(rows) == 2, bb.explain(f"not two rows of batched-bench:\n{bb.stdout}")
    assert_stats_table(bb.stderr, CFG["n_layers"], TARGET_KEEP, explain=bb.explain)


def test_llama_cli_one_turn_chat_with_a_q4_0_cache(shipped_f32):
    """llama-cli as a person runs it once from a shell (`-st -p PROMPT`, stdin closed; the
    shipped model has no chat template: chatml), with the flags: a reply, every layer sparse."""
    res = run([tool("llama-cli"), "-m", shipped_f32, "--chat-template", "chatml", "-st", "-p", "Who is there?",
               "-n", "16", "--temp", "0", "--seed", "1", "-t", THREADS, "--simple-io", "--no-warmup",
               *cache_flags("q4_0")], env=tool_env(True), timeout=120)
    assert res.stdout.strip(), res.explain("llama-cli printed nothing")  # (it logs no warnings)
    assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, explain=res.explain)


def test_llama_server_with_a_q8_0_cache_gives_the_completion_text(shipped_f32, tmp_path):
    want, _ = llama_completion(shipped_f32, PROMPT, N_PREDICT, True, *cache_flags("q8_0"))
    srv = Server(shipped_f32, tmp_path, *cache_flags("q8_0"), "-lv", "4", with_plugin=True, stats=True,
                 n_parallel=2)
    try:
        got = srv.post("/completion", {"prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0,
                                       "seed": 1, "cache_prompt": False})["content"]
        assert got == want, srv.explain(f"/completion gave {got!r}, llama-completion {want!r}")
        chat = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Who?"}],
                                                 "max_tokens": 8, "temperature": 0})
        assert chat["choices"][0]["message"]["content"] is not None, chat
    finally:
        rc, log = srv.stop()
    assert kv_cache_mib(log)[0] == "q8_0", log[-3000:]
    assert_stats_table(log, CFG["n_layers"], TARGET_KEEP, explain=lambda w: f"{w}\n{log[-3000:]}")


def test_spark_bench_takes_a_quantized_cache(shipped_f32):
    res = spark_cli("bench", "-m", shipped_f32, "-p", "16", "-n", "4", "-r", "1", "-t", THREADS,
                    "--cache-type", "q4_0", "-o", "json")
    records = json.loads(res.stdout)
    assert records and {(r["type_k"], r["type_v"]) for r in records} == {("q4_0", "q4_0")}, records
