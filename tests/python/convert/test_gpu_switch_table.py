"""tools/gpu-switch-table.py (tools/gpu-check.sh's `switch` phase) on llama-bench JSON written
here: the rows, the switch point per part (the smallest ubatch size from which the dense choice
wins at every larger size), and a clear error on a missing file."""

from __future__ import annotations

import json
import subprocess
import sys

from convert_helpers import ROOT

SCRIPT = ROOT / "tools" / "gpu-switch-table.py"


def bench(path, model, ts_by_ub):
    path.write_text(json.dumps([{"model_filename": f"/m/{model}.gguf", "n_ubatch": ub, "avg_ts": ts}
                                for ub, ts in ts_by_ub.items()]))
    return path


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True)


def test_rows_and_switch_points(tmp_path):
    sparse = tmp_path / "sparse.json"
    sparse.write_text(json.dumps(
        [{"model_filename": "/m/spark-gemma2-2b-q8_0.gguf", "n_ubatch": ub, "avg_ts": ts}
         for ub, ts in {8: 900.0, 32: 2000.0, 128: 3000.0, 512: 4000.0}.items()]
        + [{"model_filename": "/m/gemma2-2b-q8_0.gguf", "n_ubatch": ub, "avg_ts": ts}
           for ub, ts in {8: 1000.0, 32: 3000.0, 128: 9000.0, 512: 18000.0}.items()]))
    # the dense graph loses at 8, wins at 32 but loses again at 128 (noise): its switch is 512;
    # the dense FFN wins from 32 on
    dense = bench(tmp_path / "dense.json", "spark-gemma2-2b-q8_0", {8: 500.0, 32: 2100.0, 128: 2900.0, 512: 20000.0})
    ffn = bench(tmp_path / "ffn.json", "spark-gemma2-2b-q8_0", {8: 600.0, 32: 2500.0, 128: 8000.0, 512: 12000.0})
    res = run(sparse, dense, ffn)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "| 8 | 900.0 | 500.0 | 600.0 | 1000.0 | 0.90x |" in lines, res.stdout
    assert "| 512 | 4000.0 | 20000.0 | 12000.0 | 18000.0 | 1.11x |" in lines, res.stdout
    assert "dense FFN: faster than the Spark kernels from -ub 32 on" in lines, res.stdout
    assert "dense FFN and attention: faster than the Spark kernels from -ub 512 on" in lines, res.stdout


def test_a_missing_file_is_one_line_and_exit_1(tmp_path):
    res = run(tmp_path / "none.json", tmp_path / "b.json", tmp_path / "c.json")
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith("gpu-switch-table: ") and "none.json" in res.stderr, res.stderr
