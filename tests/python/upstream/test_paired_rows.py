"""K2 and V side by side (`spark-convert --pair-k2v`: one tensor `blk.N.ffn_k2v` whose row j is
neuron j's K2 row then its V row, docs/SPEC.md section 3) through llama.cpp's own tools with and
without the plugin. The paired file holds the same bytes per row as the two tensors of the
separate layout and the graph reads K2 and V as views of it (patch 0023, spark-gemma2.cpp), so
every path must give the separate layout's logits bit for bit: the Spark kernels in memory, the
Spark kernels with rows requested from storage (`SPARK_PAGING=always`: one request per neuron
for both of its rows, spark-backend/src/rows/paging.rs), and the dense stock-op graph without the
plugin (K2's product and V's outer products over strided views).

Its speed under a memory budget is tools/bench-memory.sh's (`--layout separate,paired`,
docs/PERF.md, "Models larger than memory")."""

from __future__ import annotations

import re

import gguf
import pytest

from upstream_helpers import (CFG, HELDOUT, MODEL_NPZ, llama_completion, llama_perplexity, run,
                              spark_binary, spark_run_text, stat)

PPL_ARGS = ["-c", "256", "-b", "256", "--chunks", "3"]
STREAMING_LINE = "are not all in memory"


@pytest.fixture(scope="module")
def layouts(upstream_models) -> dict:
    """{layout: path} of the shipped model as q8_0 (V's part starts after K2's whole blocks),
    separate and paired."""
    out = {}
    for layout, extra in [("separate", []), ("paired", ["--pair-k2v"])]:
        out[layout] = upstream_models / f"spark-shakespeare-q8_0-{layout}.gguf"
        run([spark_binary("spark-convert"), MODEL_NPZ, out[layout], "--outtype", "q8_0", "--quiet",
             *extra])
    return out


def test_the_paired_file_holds_one_row_tensor_per_layer(layouts):
    names = [t.name for t in gguf.GGUFReader(layouts["paired"]).tensors]
    paired = [n for n in names if n.endswith(".ffn_k2v.weight")]
    assert len(paired) == CFG["n_layers"], names
    assert not [n for n in names if n.endswith((".ffn_up.weight", ".ffn_down_t.weight"))], names


# llama-perplexity's per-chunk rows and statistics (not its timings): the same logits print the
# same report, line for line (the KL divergence against a base file is not exactly 0 even for
# the same model, as the base stores its log-probabilities in 16 bits)
REPORT_LINE = re.compile(r"^\s*(\d+\s{2,}\S|Mean|Maximum|Minimum|Median|Cor\(|Same top|[0-9.]+%\s)")


def report(res) -> list[str]:
    lines = [line for line in (res.stdout + res.stderr).splitlines() if REPORT_LINE.match(line)]
    assert len(lines) > 10, res.explain("no perplexity / KLD report")
    return lines


@pytest.mark.parametrize("with_plugin", [True, False], ids=["spark", "dense-graph"])
def test_paired_rows_give_the_logits_of_separate_rows(layouts, tmp_path, with_plugin):
    base = tmp_path / "separate.kld"
    llama_perplexity(layouts["separate"], *PPL_ARGS, "-f", HELDOUT, "--kl-divergence-base", base,
                     with_plugin=with_plugin)
    modes = [{}, {"SPARK_PAGING": "always"}] if with_plugin else [{}]
    for env in modes:
        got = {}
        for layout in ["separate", "paired"]:
            res = llama_perplexity(layouts[layout], *PPL_ARGS, "--kl-divergence-base", base,
                                   "--kl-divergence", with_plugin=with_plugin, env=env)
            assert (STREAMING_LINE in res.stderr) == ("SPARK_PAGING" in env), res.explain(f"{env}")
            got[layout] = report(res)
        assert got["paired"] == got["separate"], \
            "\n".join(f"{a!r} vs {b!r}" for a, b in zip(got["paired"], got["separate"]) if a != b)
        assert stat(res, "Same top p") == 100.0, res.explain(f"{env}: top token")
        print(f"\n{env or 'in memory'}, plugin {with_plugin}: {len(got['paired'])} report lines the "
              f"same; mean KLD {stat(res, 'Mean    KLD')}")


def test_greedy_text_is_the_same_in_llama_completion_and_spark_run(layouts):
    want, _ = llama_completion(layouts["separate"], "ROMEO:", 24, True)
    text, res = llama_completion(layouts["paired"], "ROMEO:", 24, True)
    assert text == want, res.explain(f"llama-completion: {text!r} vs {want!r}")
    want, _ = spark_run_text(layouts["separate"], "ROMEO:", 24)
    text, res = spark_run_text(layouts["paired"], "ROMEO:", 24)
    assert text == want and text.strip(), res.explain(f"spark run: {text!r} vs {want!r}")
