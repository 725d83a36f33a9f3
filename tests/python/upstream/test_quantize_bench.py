"""llama-quantize and llama-bench on the shipped Spark model: a Q4_K_M quantization made by
llama-quantize runs with the Spark plugin, and llama-bench prints its table and JSON records,
with the plugin (sparse kernels) and without it (dense stock-op graph)."""

from __future__ import annotations

import json

import pytest

from upstream_helpers import (CFG, TARGET_KEEP, THREADS, assert_stats_table, llama_completion,
                              parse_stats, run, tool, tool_env)


def test_llama_quantize_q4_k_m_runs_with_the_plugin(shipped_f32, shipped_quantized):
    q = shipped_quantized("Q4_K_M")  # llama-quantize F32 -> Q4_K_M (exit 0, file written)
    assert q.stat().st_size < shipped_f32.stat().st_size / 4, (q.stat().st_size,
                                                                shipped_f32.stat().st_size)
    text, res = llama_completion(q, "ROMEO:", 24, True)
    assert text.strip(), res.explain("no text from the Q4_K_M model")
    # the predictor is quantized too, so the thresholds move a little: 2 % instead of 1.5 %
    stats = assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, tol=0.02,
                               explain=res.explain)
    print(f"\nQ4_K_M: {q.stat().st_size} bytes; 'ROMEO:' -> {text!r}\n" + "\n".join(stats.lines))


BENCH = ["-p", "32", "-n", "8", "-r", "1", "-t", THREADS]


@pytest.mark.parametrize("with_plugin", [True, False], ids=["sparse", "dense-graph"])
def test_llama_bench_table_and_json(shipped_f32, with_plugin):
    env = tool_env(with_plugin)
    md = run([tool("llama-bench"), "-m", shipped_f32, *BENCH, "-o", "md"], env=env, timeout=300)
    rows = [line for line in md.stdout.splitlines() if line.startswith("|")]
    assert len(rows) == 4 and "model" in rows[0] and "t/s" in rows[0], md.explain(
        f"not llama-bench's markdown table (header, rule, pp32, tg8):\n{md.stdout}")
    assert "pp32" in rows[2] and "tg8" in rows[3], md.stdout
    stats = parse_stats(md.stderr)
    if with_plugin:
        assert stats.header and len(stats.rows) == CFG["n_layers"], md.explain("no spark-stats")
    else:
        assert not stats.lines, md.explain(f"spark-stats without the plugin: {stats.lines}")

    js = run([tool("llama-bench"), "-m", shipped_f32, *BENCH, "-o", "json"], env=env,
             timeout=300)
    try:
        records = json.loads(js.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(js.explain(f"-o json is not JSON ({e}):\n{js.stdout}"), pytrace=False)
    tests = {(r["n_prompt"], r["n_gen"]): r for r in records}
    assert set(tests) == {(32, 0), (0, 8)}, records
    for r in records:
        assert r["avg_ts"] > 0, r
        assert r["n_threads"] == int(THREADS), r
        # llama-bench names the registered backends other than CPU: the plugin's "Spark" entry
        # (it has no devices, so nothing is offloaded to it: ngl has no effect)
        assert r["backends"] == ("Spark" if with_plugin else "CPU"), r
    print(f"\n{'sparse (plugin)' if with_plugin else 'dense graph'}:\n{md.stdout}"
          f"json: pp32 {tests[(32, 0)]['avg_ts']:.1f} t/s, tg8 {tests[(0, 8)]['avg_ts']:.1f} t/s, "
          f"backends {tests[(32, 0)].get('backends')!r}")
