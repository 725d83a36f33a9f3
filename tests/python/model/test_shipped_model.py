"""The shipped trained model (models/spark-shakespeare.npz) through the whole pipeline:
spark-convert -> GGUF -> patched llama.cpp with the Spark kernels -> `spark perplexity`, compared
with the held-out perplexity the training framework measured (models/spark-shakespeare.eval.json,
same tokenizer, same context, llama-perplexity's method), and the sparsity it measured."""

import json
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = ROOT / "models" / "spark-shakespeare.npz"
EVAL = json.loads((ROOT / "models" / "spark-shakespeare.eval.json").read_text())
HELDOUT = ROOT / "models" / "heldout.txt"


@pytest.fixture(scope="module")
def gguf(bin_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("shipped") / "spark-shakespeare-f32.gguf"
    subprocess.run(
        [str(bin_dir / "spark-convert"), str(MODEL), str(out), "--outtype", "f32", "--quiet"],
        check=True,
    )
    return out


def perplexity(bin_dir, model, *extra):
    sl = EVAL["slice_first_8_chunks"]
    proc = subprocess.run(
        [str(bin_dir / "spark"), "perplexity", "-m", str(model), "-f", str(HELDOUT),
         "-c", str(sl["n_ctx"]), "--chunks", str(sl["n_chunks"]), "--spark-stats", *extra],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", proc.stdout)
    assert m, proc.stdout
    stats = {}
    for line in proc.stderr.splitlines():
        f = line.split()
        if len(f) == 6 and f[0] == "spark-stats:" and f[1].isdigit():
            stats[int(f[1])] = (float(f[2]), float(f[4]))
    return float(m.group(1)), stats


@pytest.mark.parametrize("cache", ["f32", "f16"])
def test_perplexity_matches_training_framework(bin_dir, gguf, cache):
    want = EVAL["slice_first_8_chunks"]["ppl"]
    got, stats = perplexity(bin_dir, gguf, "--cache-type", cache)
    assert abs(got - want) / want <= 0.01, (got, want)
    cfg = EVAL["config"]
    target = cfg["ffn_k"] / cfg["d_ff"]
    assert len(stats) == cfg["n_layers"]
    for layer, (keep, attended) in stats.items():
        # FFN keep rate 8% +- 1.5% per layer; attention keeps about k_a once the context is longer.
        assert abs(keep - target) <= 0.015, (layer, keep)
        assert attended <= cfg["attn_k"] * 1.1, (layer, attended)


def test_dense_path_agrees(bin_dir, gguf):
    sparse, _ = perplexity(bin_dir, gguf, "--cache-type", "f32")
    dense, _ = perplexity(bin_dir, gguf, "--cache-type", "f32", "--dense")
    assert abs(sparse - dense) / dense <= 0.005, (sparse, dense)


def test_perplexity_rejects_short_text(bin_dir, gguf, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("ROMEO.\n")
    proc = subprocess.run(
        [str(bin_dir / "spark"), "perplexity", "-m", str(gguf), "-f", str(short), "-c", "256"],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert "less than one chunk" in proc.stderr
