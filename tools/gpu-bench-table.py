#!/usr/bin/env python3
"""The table of tools/gpu-check.sh's bench phase: llama-bench's JSON of Spark and stock models
as one row per size, type, test, depth and thread count, with the measured Spark / stock ratio
and, for decode (tg) rows, the ratio tools/predict-ratio.py predicts for the same files.

    python3 tools/gpu-bench-table.py BENCH.json [--kernels SPARK,STOCK] [--bandwidth GBPS]
        [--kernel-us US]

Model files are named PRESET-TYPE.gguf (`spark-gemma2-2b-q8_0.gguf`); a Spark model's stock twin
is the same name without `spark-` (`gemma2-2b-q8_0.gguf`), found beside it. The prediction
needs gguf-py (the .venv's, or PYTHONPATH=llama.cpp/gguf-py); without it the column says why.
Prefill rows get no prediction: a 512-token ubatch is bound by arithmetic, not by bytes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path


def predictor():
    """tools/predict-ratio.py as a module."""
    path = Path(__file__).resolve().parent / "predict-ratio.py"
    spec = importlib.util.spec_from_file_location("predict_ratio", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while being made
    spec.loader.exec_module(mod)
    return mod


def parse_args(argv):
    pr = predictor()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", type=Path, help="llama-bench -o json output")
    ap.add_argument("--kernels", type=pr.kernel_pair,
                    help="kernels per layer per decode step, SPARK,STOCK; default: bytes only")
    ap.add_argument("--bandwidth", type=float, default=pr.H200_BANDWIDTH_GBPS)
    ap.add_argument("--kernel-us", type=float, default=pr.H200_KERNEL_US)
    return pr, ap.parse_args(argv)


def main(argv: list[str]) -> int:
    pr, a = parse_args(argv)
    try:
        rows = json.loads(a.bench_json.read_text())
    except (OSError, ValueError) as e:
        print(f"gpu-bench-table: {a.bench_json}: {e}", file=sys.stderr)
        return 1
    try:
        import gguf
    except ImportError:
        gguf = None
    res, files = {}, {}
    for r in rows:
        path = Path(r["model_filename"])
        kind, typ = path.name.removesuffix(".gguf").rsplit("-", 1)
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        res[(kind, typ, test, r["n_depth"], r["n_threads"])] = (r["avg_ts"], r["stddev_ts"])
        files[(kind, typ)] = path
    models = {}

    def prediction(kind: str, typ: str, depth: int) -> str:
        if gguf is None:
            return "no gguf-py"
        spark, stock = files.get((kind, typ)), files.get((kind.removeprefix("spark-"), typ))
        if spark is None or stock is None:
            return "?"
        try:
            for p in (spark, stock):
                if p not in models:
                    models[p] = pr.load(p, gguf)
        except pr.PredictError as e:
            return f"? ({e})"
        row = pr.predict(models[spark], models[stock], 1, depth, 2.0, a.kernels, a.bandwidth,
                         a.kernel_us)
        return f"{row['predicted_ratio']:.2f}x"

    what = ("bytes" if a.kernels is None else
            f"bytes + {a.kernels[0]:g} / {a.kernels[1]:g} kernels per layer at {a.kernel_us:g} us, "
            f"{a.bandwidth:g} GB/s")
    print(f"| model | type | test | depth | threads | Spark t/s | stock t/s | Spark/stock | "
          f"predicted ({what}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(k for k in res if k[0].startswith("spark-")):
        kind, typ, test, depth, threads = key
        s = res[key]
        g = res.get((kind.removeprefix("spark-"),) + key[1:])
        ratio = f"**{s[0] / g[0]:.2f}x**" if g else "?"
        gs = f"{g[0]:.2f} +/- {g[1]:.2f}" if g else "?"
        pred = prediction(kind, typ, depth) if test.startswith("tg") else "-"
        print(f"| {kind} | {typ} | {test} | {depth} | {threads} | {s[0]:.2f} +/- {s[1]:.2f} | "
              f"{gs} | {ratio} | {pred} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
