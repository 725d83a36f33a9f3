"""The Spark plugin beside llama.cpp's Vulkan backend (a device that cannot run the Spark ops),
on Mesa's CPU Vulkan driver, lavapipe: `bash tools/vulkan-check.sh` builds the patched
llama.cpp with GGML_VULKAN=ON and runs this file with SPARK_VULKAN_BIN set to that build's bin
folder. Skipped without it (CI: a second llama.cpp build does not fit its time).

Every run is that build's llama-completion with every layer on Vulkan0 (`-ngl 99`), with and
without the plugin:
- Gemma 3n (the tiny f32 model of tools/gemma3n-synth.py): its sparse layers keep upstream's
  graph on Vulkan0, said in one load line; no Spark kernel runs (the SPARK_STATS table has no
  row); the scheduler makes as many graph splits with as many inputs as without the plugin
  (GGML_SCHED_DEBUG at -v: nothing is copied back to the CPU per layer); the text is the
  same.
- spark-gemma2 (the shipped model, f32 and q8_0): one warning names the layers on Vulkan0, which step
  aside for the dense graph of stock ops there; no Spark kernel runs, the graph splits and their
  inputs are those of the run without the plugin (the same dense graph), and so is the text;
  llama-perplexity's KL divergence against the CPU's Spark kernels, at 256-token ubatches and
  at one token per ubatch."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gemma3n_helpers import N_LAYER_SPARSE, uh

VULKAN_BIN = os.environ.get("SPARK_VULKAN_BIN")
pytestmark = pytest.mark.skipif(
    not VULKAN_BIN, reason="SPARK_VULKAN_BIN is not set: run bash tools/vulkan-check.sh")

PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak."
N_PREDICT = 16


@pytest.fixture(autouse=True)
def vulkan_tools(monkeypatch):
    """uh.llama_completion runs the Vulkan build's llama-completion (the plugin stays the one
    tools/upstream.sh installed: same series tag), and ggml-vulkan takes lavapipe: a device of
    type CPU, which it leaves out unless named (GGML_VK_VISIBLE_DEVICES)."""
    monkeypatch.setattr(uh, "UPSTREAM_BIN", Path(VULKAN_BIN))
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", os.environ.get("GGML_VK_VISIBLE_DEVICES", "0"))


def on_vulkan(model: Path, with_plugin: bool) -> tuple[str, uh.Result]:
    """Greedy text of every layer on Vulkan0, the scheduler's splits printed (GGML_SCHED_DEBUG=1
    at -v)."""
    os.environ["GGML_SCHED_DEBUG"] = "1"
    try:
        text, res = uh.llama_completion(model, PROMPT, N_PREDICT, with_plugin, "-ngl", "99",
                                        "-dev", "Vulkan0", "-v", timeout=600)
    finally:
        del os.environ["GGML_SCHED_DEBUG"]
    assert "Vulkan0" in res.stderr, res.explain("no Vulkan0 device in the log")
    return text, res


def splits(stderr: str) -> tuple[int, int]:
    """(graph splits, their inputs) over the whole run, from GGML_SCHED_DEBUG's lines."""
    found = re.findall(r"## SPLIT #\d+: (\S+) # (\d+) inputs", stderr)
    return len(found), sum(int(n) for _, n in found)


def same_as_without_the_plugin(model: Path):
    """Runs `model` on Vulkan0 without and with the plugin; with it no Spark kernel runs, the
    scheduler makes the same graph splits with the same inputs (nothing copied back to the CPU
    per layer) and the text is the same. Returns (text, result with the plugin, result without)."""
    stock, stock_res = on_vulkan(model, False)
    text, res = on_vulkan(model, True)
    stats = uh.parse_stats(res.stderr)
    assert not stats.rows, res.explain(f"Spark kernels ran for layers {sorted(stats.rows)}")
    assert splits(res.stderr) == splits(stock_res.stderr), res.explain(
        f"graph splits (count, inputs) {splits(res.stderr)} with the plugin, "
        f"{splits(stock_res.stderr)} without")
    assert stock.strip() and text == stock, res.explain(
        f"text with the plugin {text!r} != without {stock!r}")
    return text, res, stock_res


def test_gemma3n_on_vulkan_keeps_upstreams_graph(tiny):
    spark, res, stock_res = same_as_without_the_plugin(tiny["f32"])
    said = re.findall(r"Spark: sparse FFN layers (\d+)-(\d+) are on (\S+), which does not run "
                      r"the Spark ops: they keep upstream's graph there", res.stderr)
    assert said == [("0", str(N_LAYER_SPARSE - 1), "Vulkan0")], res.explain(
        f"the load line for the sparse layers on Vulkan0: got {said}")
    print(f"\nGemma 3n on Vulkan0 (lavapipe): {spark!r}; splits (count, inputs) "
          f"{splits(res.stderr)} with and without the plugin; {res.seconds:.1f} s / "
          f"{stock_res.seconds:.1f} s")


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_spark_gemma2_on_vulkan_steps_aside_for_the_dense_graph(tmp_path, outtype):
    """q8_0: V's stock-layout copy goes through a get_rows of every neuron on Vulkan0."""
    model = tmp_path / f"spark-shakespeare-{outtype}.gguf"
    uh.run([uh.spark_binary("spark-convert"), uh.MODEL_NPZ, model, "--outtype", outtype, "--quiet"])
    text, res, _ = same_as_without_the_plugin(model)
    said = re.findall(r"spark-gemma2: layers (\d+)-(\d+) are on (\S+), which does not run the "
                      r"Spark ops: they run the dense graph there", res.stderr)
    assert len(said) == 1 and said[0][0] == "0" and said[0][2] == "Vulkan0", res.explain(
        f"the load line for the layers on Vulkan0: got {said}")
    print(f"\nspark-gemma2 {outtype} on Vulkan0 (lavapipe): layers {said[0][0]}-{said[0][1]} on "
          f"the dense graph there; splits (count, inputs) {splits(res.stderr)} with and without the plugin; "
          f"{text!r}")


@pytest.mark.parametrize("ubatch", ["256", "1"])
def test_spark_gemma2_dense_graph_on_vulkan_matches_the_cpu(tmp_path, ubatch):
    """The logits of the layers on Vulkan0 (the dense graph there) against the CPU's Spark
    kernels (-ngl 0) on the same f32 file: mean KL divergence within the GPU check's bound,
    5e-4. One token per ubatch once read the cache's K parts wrongly in ggml-vulkan's
    matrix-vector product (mean KLD 1.3; the graph now copies them contiguous)."""
    model = tmp_path / "spark-shakespeare-f32.gguf"
    uh.run([uh.spark_binary("spark-convert"), uh.MODEL_NPZ, model, "--outtype", "f32", "--quiet"])
    base = tmp_path / "cpu.kld"
    common = [model, "-c", "256", "-b", "256", "--chunks", "1"]
    uh.llama_perplexity(*common, "-f", uh.HELDOUT, "-ngl", "0", "--kl-divergence-base", base)
    res = uh.llama_perplexity(*common, "-ub", ubatch, "-ngl", "99", "-dev", "Vulkan0",
                              "--kl-divergence-base", base, "--kl-divergence")
    kld = uh.stat(res, "Mean    KLD")
    print(f"\nspark-gemma2 f32 on Vulkan0, -ub {ubatch}: mean KLD {kld:.6f} against the CPU, "
          f"same top p {uh.stat(res, 'Same top p')} %")
    assert kld <= 5e-4, res.stdout
    assert uh.parse_stats(res.stderr).none_ran, res.explain("Spark kernels ran on Vulkan0's layers")
