"""FFN rows read from storage (issue 55, spark-backend/src/rows/paging.rs) through llama.cpp's own
tools with the plugin: with `SPARK_PAGING=always` every layer's K2 and V rows are treated as not in
memory (advised MADV_RANDOM, each step's rows requested with MADV_WILLNEED before the kernels read
them), which is what a memory-mapped model larger than the memory left to it gets. Advice never
changes what the memory holds, so the logits must be bit for bit those of the model in memory;
the plugin says once that rows stream, and a model in memory says nothing.

The same under a real budget (the file's pages evicted, memory held away by
tools/memory-budget.py) is tools/bench-memory.sh's (docs/PERF.md, "Models larger than memory"):
too slow for CI; the kernel-level test on an evicted file is spark-backend/tests/paging.rs."""

from __future__ import annotations

from upstream_helpers import HELDOUT, llama_completion, llama_perplexity, stat

STREAMING_LINE = "are not all in memory"
PPL_ARGS = ["-c", "256", "-b", "256", "--chunks", "3"]


def test_rows_requested_from_storage_give_the_logits_of_memory(shipped_f32, tmp_path):
    base = tmp_path / "in-memory.kld"
    res0 = llama_perplexity(shipped_f32, *PPL_ARGS, "-f", HELDOUT, "--kl-divergence-base", base)
    assert STREAMING_LINE not in res0.stderr, res0.explain("a model in memory said its rows stream")
    res = llama_perplexity(shipped_f32, *PPL_ARGS, "--kl-divergence-base", base, "--kl-divergence",
                           env={"SPARK_PAGING": "always"})
    lines = [line for line in res.stderr.splitlines() if STREAMING_LINE in line]
    assert len(lines) == 1, res.explain(f"not one line that rows stream: {lines}")
    assert "layer 0" in lines[0] and "K2 and V rows are requested" in lines[0], lines[0]
    print(f"\n{lines[0]}\nmean KLD {stat(res, 'Mean    KLD')}, same top {stat(res, 'Same top p')} %")
    assert stat(res, "Mean    KLD") == 0.0, res.stdout
    assert stat(res, "Same top p") == 100.0, res.stdout


def test_greedy_text_is_the_same_in_every_mode_and_a_bad_value_is_named(shipped_f32):
    want, _ = llama_completion(shipped_f32, "ROMEO:", 24, True)
    for mode in ["always", "never", "sometimes"]:
        text, res = llama_completion(shipped_f32, "ROMEO:", 24, True, env={"SPARK_PAGING": mode})
        assert text == want, res.explain(f"SPARK_PAGING={mode}: {text!r} vs {want!r}")
        assert (STREAMING_LINE in res.stderr) == (mode == "always"), res.explain(f"SPARK_PAGING={mode}")
    assert "SPARK_PAGING: 'sometimes' is not auto, always or never; auto applies" in res.stderr, \
        res.explain("the bad value was not named")
