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


def kld_run(bin_dir, model, base, *extra):
    sl = EVAL["slice_first_8_chunks"]
    proc = subprocess.run(
        [str(bin_dir / "spark"), "perplexity", "-m", str(model), "-c", str(sl["n_ctx"]),
         "--kl-divergence-base", str(base), *extra],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def stat(text, name):
    m = re.search(re.escape(name) + r"\s*:\s*([0-9.]+)", text)
    assert m, (name, text)
    return float(m.group(1))


@pytest.fixture(scope="module")
def kld_base(bin_dir, gguf, tmp_path_factory):
    base = tmp_path_factory.mktemp("kld") / "f32.kld"
    sl = EVAL["slice_first_8_chunks"]
    out = kld_run(bin_dir, gguf, base, "-f", str(HELDOUT), "--chunks", str(sl["n_chunks"]),
                  "--cache-type", "f32")
    ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", out).group(1))
    return base, ppl


def test_kl_divergence_of_a_model_with_itself_is_zero(bin_dir, gguf, kld_base):
    base, ppl = kld_base
    out = kld_run(bin_dir, gguf, base, "--kl-divergence", "--cache-type", "f32")
    assert stat(out, "Mean PPL(Q)") == pytest.approx(ppl, rel=1e-5)
    assert stat(out, "Mean PPL(base)") == pytest.approx(ppl, rel=1e-5)
    assert stat(out, "Maximum KLD") <= 1e-6, out
    assert stat(out, "Same top p") == pytest.approx(100.0), out


@pytest.mark.parametrize("qtype, max_kld", [("Q8_0", 0.01), ("Q4_K_M", 0.2)])
def test_quantized_model_kl_divergence(bin_dir, gguf, kld_base, tmp_path, qtype, max_kld):
    base, ppl = kld_base
    q = tmp_path / f"{qtype}.gguf"
    subprocess.run([str(bin_dir / "spark"), "quantize", str(gguf), str(q), qtype, "--quiet"],
                   check=True, timeout=300)
    out = kld_run(bin_dir, q, base, "--kl-divergence")
    print(qtype, out)
    assert stat(out, "Mean PPL(base)") == pytest.approx(ppl, rel=1e-5)
    kld = stat(out, "Mean    KLD")
    # quantization moves the distributions, but only a little
    assert 0 < kld <= max_kld, out
    assert stat(out, "Same top p") >= 80.0, out
    assert abs(stat(out, "Mean PPL(Q)") - ppl) / ppl <= 0.1, out


def test_kl_divergence_rejects_a_foreign_base_file(bin_dir, gguf, tmp_path):
    bogus = tmp_path / "bogus.kld"
    bogus.write_bytes(b"GGUF" + bytes(100))
    proc = subprocess.run(
        [str(bin_dir / "spark"), "perplexity", "-m", str(gguf), "--kl-divergence",
         "--kl-divergence-base", str(bogus)],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert "bogus.kld" in proc.stderr and "bad magic" in proc.stderr, proc.stderr
