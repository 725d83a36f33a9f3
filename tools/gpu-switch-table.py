#!/usr/bin/env python3
"""The switch-point table of tools/gpu-check.sh's `switch` phase: llama-bench JSON of pp512 at
several ubatch sizes, run three times with the Spark switch points moved (SPARK_FFN_DENSE_FROM /
SPARK_ATTN_DENSE_FROM: 0 0 = the Spark kernels always, 1 1 = the dense graph always, 1 0 = the
dense FFN with the sparse attention), the stock model in the first run. Prints one Markdown row
per ubatch size and, per part, the smallest size from which the dense choice is faster at every
larger size: the number spark-backend/src/dense_switch.rs's CUDA_DENSE_FROM_TOKENS should hold.

Usage: gpu-switch-table.py SPARSE.json DENSE.json FFN_DENSE.json
"""

from __future__ import annotations

import json
import os
import sys

COLUMNS = ("sparse", "dense", "ffn dense")


def load(paths: list[str]) -> dict[int, dict[str, float]]:
    """{n_ubatch: {column: t/s}}; a model whose file name starts with "gemma2" is "stock"."""
    rows: dict[int, dict[str, float]] = {}
    for path, column in zip(paths, COLUMNS):
        with open(path) as f:
            for r in json.load(f):
                stock = os.path.basename(r["model_filename"]).startswith("gemma2")
                rows.setdefault(int(r["n_ubatch"]), {})["stock" if stock else column] = float(r["avg_ts"])
    return rows


def switch_point(rows: dict[int, dict[str, float]], column: str) -> int | None:
    """The smallest ubatch size from which `column` beats "sparse" at it and every larger size."""
    point = None
    for ub in sorted(rows, reverse=True):
        if rows[ub].get(column, 0.0) > rows[ub].get("sparse", 0.0):
            point = ub
        else:
            break
    return point


def table(rows: dict[int, dict[str, float]]) -> list[str]:
    out = ["| -ub | Spark kernels t/s | dense graph t/s | dense FFN, sparse attention t/s | stock t/s "
           "| best / stock |", "|---|---|---|---|---|---|"]
    for ub in sorted(rows):
        r = rows[ub]
        cells = [f"{r[c]:.1f}" if c in r else "-" for c in (*COLUMNS, "stock")]
        best = max((r[c] for c in COLUMNS if c in r), default=0.0)
        ratio = f"{best / r['stock']:.2f}x" if r.get("stock") else "-"
        out.append(f"| {ub} | {' | '.join(cells)} | {ratio} |")
    for part, column in (("FFN", "ffn dense"), ("FFN and attention", "dense")):
        point = switch_point(rows, column)
        out.append(f"dense {part}: faster than the Spark kernels from -ub {point} on" if point
                   else f"dense {part}: not faster than the Spark kernels at the largest size")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        rows = load(argv[1:])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"gpu-switch-table: {e}", file=sys.stderr)
        return 1
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
