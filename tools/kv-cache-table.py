#!/usr/bin/env python3
"""The table of tools/bench-kv-cache.sh: llama-bench JSONL records (each tagged with its
`config`: "spark T", "stock -fa 1 T", "stock -fa 0 T") of a Spark-Gemma2 and a stock Gemma-2
file, as one markdown table per cache type and test: t/s, Spark / stock, and the bytes one decode
token reads (the limit of a memory-bound decode), with the KV cache's MiB per 1K tokens.

The bytes per decode token at depth d are tools/predict-ratio.py's (`step_bytes`: the weights a
step reads, k_f/F of the FFN's row tensors for Spark, and the KV cache: every cached K and V row
for stock, the first r_a dims of every key and whole rows at the kept positions for Spark), at
the cache type's bytes per value.

Usage: kv-cache-table.py RECORDS.jsonl SPARK.gguf STOCK.gguf"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path

# bytes per cached value of each type llama.cpp offers for K and V
VALUE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
               "q4_1": 20 / 32, "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
MIB = 1 << 20


def predictor():
    """tools/predict-ratio.py as a module: the bytes a decode step reads."""
    path = Path(__file__).resolve().parent / "predict-ratio.py"
    spec = importlib.util.spec_from_file_location("predict_ratio", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while being made
    spec.loader.exec_module(mod)
    return mod


def kv_mib_per_1k(m, cache: str) -> float:
    return m.n_layers * m.n_kv_heads * 2 * m.head_dim * VALUE_BYTES[cache] * 1024 / MIB


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    records, spark_path, stock_path = argv[1:]
    import gguf

    pr = predictor()
    spark, stock = pr.load(Path(spark_path), gguf), pr.load(Path(stock_path), gguf)
    ts: dict = defaultdict(dict)  # (cache, test) -> config -> t/s
    for line in open(records):
        if not line.strip():
            continue
        rec = json.loads(line)
        test = f"pp{rec['n_prompt']}" if rec["n_gen"] == 0 else f"tg{rec['n_gen']} @ d{rec['n_depth']}"
        ts[(rec["type_k"], test)][rec["config"].rsplit(" ", 1)[0]] = rec["avg_ts"]
    print("| KV cache | test | Spark t/s | stock -fa 1 t/s | Spark / stock -fa 1 | stock -fa 0 t/s "
          "| Spark / stock -fa 0 | bytes/token stock / Spark (limit) | KV MiB per 1K tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (cache, test), row in sorted(ts.items(), key=lambda kv: (list(VALUE_BYTES).index(kv[0][0]),
                                                                   kv[0][1].startswith("tg"),
                                                                   int(kv[0][1].split("d")[-1]) if "@" in kv[0][1] else 0)):
        sp, fa1, fa0 = row.get("spark"), row.get("stock -fa 1"), row.get("stock -fa 0")
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
        cell = lambda x: f"{x:.2f}" if x else "-"
        if "@" in test:
            d = int(test.split("d")[-1])
            b = VALUE_BYTES[cache]
            limit = f"{pr.step_bytes(stock, 1, d, b) / pr.step_bytes(spark, 1, d, b):.2f}x"
        else:
            limit = "-"
        print(f"| {cache} | {test} | {cell(sp)} | {cell(fa1)} | {ratio(sp, fa1)} | {cell(fa0)} | "
              f"{ratio(sp, fa0)} | {limit} | {kv_mib_per_1k(spark, cache):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
