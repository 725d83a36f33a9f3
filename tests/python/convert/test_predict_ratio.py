"""tools/predict-ratio.py against bytes counted by hand from docs/SPEC.md (sections 2-4) for the
`tiny` and `tiny-dense` presets of `spark-convert --synthetic` in q8_0, and its refusals.

The tiny presets (converter/src/synthetic.rs): D 128, L 2, N 4, KV 2, H 32, F 512, vocabulary
512, window 64; Spark: k_f 41, r_f 64, k_a 16, r_a 16. In q8_0 every matrix here has a row
length that is a multiple of 32 (34 bytes per 32 weights); norms are f32."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from convert_helpers import ROOT, tiny_q8_0_pair

SCRIPT = ROOT / "tools" / "predict-ratio.py"
D, L, N, KV, H, F, VOCAB, W = 128, 2, 4, 2, 32, 512, 512, 64
K_F, R_F, K_A, R_A = 41, 64, 16, 16


def q8(n: int) -> float:
    return n * 34 / 32


def weights(spark: bool, tokens: int) -> float:
    """Bytes of the weights one decode step of `tokens` sequences reads."""
    total = q8(D * VOCAB) + 4 * D  # token_embd read whole (tied output), output_norm
    for _ in range(L):
        total += q8(D * N * H) + 2 * q8(D * KV * H) + q8(N * H * D)  # q, k, v, output
        total += 4 * (4 * D)  # attn_norm, post_attention_norm, ffn_norm, post_ffw_norm
        if spark:
            kept = 1 - (1 - K_F / F) ** tokens
            total += q8(R_F * F) + kept * (q8((D - R_F) * F) + q8(D * F))  # K1, K2, V
        else:
            total += 3 * q8(D * F)  # gate, up, down
    return total


def kv(spark: bool, depth: int) -> float:
    """f16 KV-cache bytes one sequence's token reads."""
    total = 0
    for layer in range(L):
        c = depth + 1 if layer % 2 else min(depth + 1, W)
        if not spark or c <= K_A:
            total += KV * c * 2 * H * 2
        else:
            total += KV * (c * R_A + min(c, N // KV * K_A) * (2 * H - R_A)) * 2
    return total


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_q8_0_pair(tmp_path_factory.mktemp("predict"))


def predict(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_bytes_per_step_are_specs(pair):
    p = predict(*pair, "--tokens", "1,3", "--depth", "0,10,40,100", "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [(r["tokens"], r["depth"]) for r in rows] == [
        (s, d) for s in (1, 3) for d in (0, 10, 40, 100)]
    for r in rows:
        s, d = r["tokens"], r["depth"]
        spark = weights(True, s) + s * kv(True, d)
        stock = weights(False, s) + s * kv(False, d)
        assert r["spark_mb"] * 1e6 == pytest.approx(spark, rel=1e-12), r
        assert r["stock_mb"] * 1e6 == pytest.approx(stock, rel=1e-12), r
        assert r["predicted_ratio"] == pytest.approx(stock / spark, rel=1e-12), r


def test_kernels_add_a_fixed_time_each(pair):
    p = predict(*pair, "--depth", "100", "--kernels", "31,25", "--bandwidth", "1000",
                "--kernel-us", "2", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    t_spark = (weights(True, 1) + kv(True, 100)) / 1e12 + L * 31 * 2e-6
    t_stock = (weights(False, 1) + kv(False, 100)) / 1e12 + L * 25 * 2e-6
    assert r["spark_ms"] == pytest.approx(t_spark * 1e3, rel=1e-12)
    assert r["predicted_ratio"] == pytest.approx(t_stock / t_spark, rel=1e-12)
    table = predict(*pair, "--depth", "100", "--kernels", "31,25")
    assert table.returncode == 0 and "| predicted ratio |" in table.stdout, table.stdout


def test_refusals_name_the_file(pair, tmp_path):
    spark, stock = pair
    p = predict(stock, spark)
    assert p.returncode == 1 and str(stock) in p.stderr and "want spark-gemma2" in p.stderr
    assert p.stdout == ""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    p = predict(spark, junk)
    assert p.returncode == 1 and str(junk) in p.stderr and "Traceback" not in p.stderr
    for bad in (["--tokens", "0"], ["--kernels", "31"], ["--depth", "x"]):
        p = predict(spark, stock, *bad)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (bad, p.stderr)


def test_gpu_bench_table_prints_the_prediction_beside_the_ratio(pair, tmp_path):
    """tools/gpu-bench-table.py (the GPU check's bench table) on a llama-bench-shaped JSON."""
    import shutil
    spark = tmp_path / "spark-gemma2-tiny-q8_0.gguf"
    stock = tmp_path / "gemma2-tiny-q8_0.gguf"
    shutil.copy(pair[0], spark)
    shutil.copy(pair[1], stock)

    def row(path, n_prompt, n_gen, depth, ts):
        return {"model_filename": str(path), "n_prompt": n_prompt, "n_gen": n_gen,
                "n_depth": depth, "n_threads": 16, "avg_ts": ts, "stddev_ts": 0.5}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps([row(spark, 0, 128, 100, 150.0), row(stock, 0, 128, 100, 100.0),
                                 row(spark, 512, 0, 0, 900.0), row(stock, 512, 0, 0, 1000.0)]))
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu-bench-table.py"), bench,
                        "--kernels", "31,25"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = {tuple(c.strip() for c in line.split("|")[1:6]): line
             for line in p.stdout.splitlines()[2:]}
    tg = lines[("spark-gemma2-tiny", "q8_0", "tg128", "100", "16")]
    want = predict(*pair, "--depth", "100", "--kernels", "31,25", "--json")
    ratio = json.loads(want.stdout)["predicted_ratio"]
    assert "**1.50x**" in tg and f"| {ratio:.2f}x |" in tg, tg
    pp = lines[("spark-gemma2-tiny", "q8_0", "pp512", "0", "16")]
    assert "**0.90x**" in pp and pp.rstrip().endswith("| - |"), pp
