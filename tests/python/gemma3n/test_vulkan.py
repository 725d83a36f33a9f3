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
- spark-gemma2 (the shipped model, f32): one warning names the layers whose Spark nodes run on
  the CPU (their weights are on Vulkan0) and how to keep them there; the run completes with
  text."""

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


def test_gemma3n_on_vulkan_keeps_upstreams_graph(tiny):
    model = tiny["f32"]
    stock, stock_res = on_vulkan(model, False)
    spark, res = on_vulkan(model, True)
    said = re.findall(r"Spark: sparse FFN layers (\d+)-(\d+) are on (\S+), which does not run "
                      r"the Spark ops: they keep upstream's graph there", res.stderr)
    assert said == [("0", str(N_LAYER_SPARSE - 1), "Vulkan0")], res.explain(
        f"the load line for the sparse layers on Vulkan0: got {said}")
    stats = uh.parse_stats(res.stderr)
    assert not stats.rows, res.explain(f"Spark kernels ran for layers {sorted(stats.rows)}")
    assert splits(res.stderr) == splits(stock_res.stderr), res.explain(
        f"graph splits (count, inputs) {splits(res.stderr)} with the plugin, "
        f"{splits(stock_res.stderr)} without")
    assert stock.strip() and spark == stock, res.explain(
        f"text with the plugin {spark!r} != without {stock!r}")
    print(f"\nGemma 3n on Vulkan0 (lavapipe): {spark!r}; splits (count, inputs) "
          f"{splits(res.stderr)} with and without the plugin; {res.seconds:.1f} s / "
          f"{stock_res.seconds:.1f} s")


def test_spark_gemma2_on_vulkan_says_where_its_spark_nodes_run(tmp_path):
    model = tmp_path / "spark-shakespeare-f32.gguf"
    uh.run([uh.spark_binary("spark-convert"), uh.MODEL_NPZ, model, "--outtype", "f32", "--quiet"])
    text, res = on_vulkan(model, True)
    said = re.findall(r"spark-gemma2: layers (\d+)-(\d+) are on (\S+), which does not run the "
                      r"Spark ops: their Spark nodes run on the CPU", res.stderr)
    assert len(said) == 1 and said[0][0] == "0" and said[0][2] == "Vulkan0", res.explain(
        f"the load line for the layers on Vulkan0: got {said}")
    assert text.strip(), res.explain("no text")
    stats = uh.parse_stats(res.stderr)
    print(f"\nspark-gemma2 on Vulkan0 (lavapipe): layers {said[0][0]}-{said[0][1]} named, "
          f"Spark kernels ran for {len(stats.rows)} layers on the CPU; splits (count, inputs) "
          f"{splits(res.stderr)}; {text!r}")
