#!/usr/bin/env python3
"""Counts the CUDA kernels a decode step's graph would launch per layer, read from the graph
llama.cpp built: the node lines `GGML_SCHED_DEBUG=2` prints at `-v` (any backend; the CPU's is
enough), with a model of what ggml-cuda launches for each node.

    .venv/bin/python tools/cuda-kernel-count.py LOG --model FILE.gguf [--json]

LOG holds the output of one run such as

    GGML_SCHED_DEBUG=2 GGML_BACKEND_PATH=target/upstream/lib/libggml-spark.so \\
        target/upstream/bin/llama-completion -m FILE.gguf -p hi -n 2 -no-cnv --no-warmup -v

whose last graph is a one-token decode step (the tool reads the last graph printed). FILE.gguf
gives the weights' types (a quantized weight costs ggml-cuda one more kernel per product) and
the number of query heads (the queries of a one-token `spark_attn` call).

The model of ggml-cuda (the pinned llama.cpp's `ggml-cuda.cu`, `ggml_cuda_can_fuse` and
`ggml_cuda_mul_mat_vec_q`), per node in graph order:
- RMS_NORM followed by its MUL (and that MUL's ADD): one fused kernel;
- ROPE whose output only a VIEW and a SET_ROWS (the KV-cache store) read, adjacent in the graph
  (the view is not printed: the SET_ROWS is the node two numbers on): one fused kernel;
- MUL_MAT of a quantized weight and one token: the activation's q8_1 quantization and the
  matrix-vector product, two kernels; of an f32/f16/bf16 weight: one; two MUL_MATs of one input
  followed by their GLU (stock's gate and up): one quantization and one fused product;
- Spark's custom ops at one token, from their CUDA plans (`spark-backend/src/*/cuda_plan.rs`,
  pinned by `tests/cuda_check.rs` and the emulation tests): `spark_ffn_fused` 2 (select-up,
  gather; on CUDA its one chunk is the output), `spark_attn` 2 (scores, select_output) for up to
  16 query heads (`FUSED_MAX_QUERIES`), else 3 (scores, select, output), `spark_rope` 1 (Q's
  two rotary embeddings and scale); the CPU's `spark_ffn_sum` node (the CPU tiling's 16
  chunks) is not in a CUDA graph: 0;
- every other node (ADD, SCALE, SET_ROWS, GET_ROWS, FLASH_ATTN_EXT, ...): one kernel.
Views, reshapes and permutes launch nothing (and are not printed). This is a model: a card's
profiler (`tools/gpu-check.sh`'s prof phase) measures the count.

Prints one line per layer and the summary; exit 0, 1 with one line when the log has no graph or
the file cannot be read, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# node #  N (      OP):            name (size) [backend ] use=U,c=C: src0 (size) [backend] src1 ...
NODE_RE = re.compile(r"node #\s*(\d+) \(\s*([A-Z_0-9]+)\):\s+(.+?) \(\s*[\d.]+[KMG]?\) \[[^\]]*\][^:]*:(.*)$")
SRC_RE = re.compile(r"\s*(.+?) \(\s*[\d.]+[KMG]?\) \[[^\]]*\]")
LAYER_RE = re.compile(r"-(\d+)$")
# llama.cpp's log prefix (time and level), which it writes before every part of a node line
LOG_PREFIX_RE = re.compile(r"\d+\.\d+\.\d+\.\d+ [A-Z] ")

# CUDA launches of Spark's custom ops for one token (module docstring); spark_attn's depend on
# the number of query heads
SPARK_OP_KERNELS = {"spark_ffn_fused": 2, "spark_ffn_sum": 0, "spark_rope": 1}
# spark-backend/src/attention/cuda_plan.rs: FUSED_MAX_QUERIES
ATTN_FUSED_MAX_QUERIES = 16

UNQUANTIZED = {"F32", "F16", "BF16"}


class CountError(Exception):
    pass


@dataclass
class Node:
    number: int
    op: str
    name: str
    srcs: list


def parse_nodes(text: str) -> list:
    """The node lines of the last graph in `text` (a graph starts again at node #0)."""
    graphs, cur = [], []
    for line in text.splitlines():
        # the debug lines carry a timestamp and level prefix in llama.cpp's log format
        i = line.find("node #")
        if i < 0:
            continue
        m = NODE_RE.match(LOG_PREFIX_RE.sub("", line[i:]))
        if not m:
            continue
        number, op, name, rest = int(m.group(1)), m.group(2), m.group(3).strip(), m.group(4)
        srcs = [s.group(1).strip() for s in SRC_RE.finditer(rest)]
        if number == 0 and cur:
            graphs.append(cur)
            cur = []
        cur.append(Node(number, op, name, srcs))
    if cur:
        graphs.append(cur)
    if not graphs:
        raise CountError("no GGML_SCHED_DEBUG=2 node lines (run with -v)")
    return graphs[-1]


@dataclass
class Model:
    types: dict  # {tensor name: ggml type name}
    n_head: int  # query heads ({arch}.attention.head_count)


def read_model(model: Path) -> Model:
    """The weights' types and the query head count of a GGUF file (gguf-py)."""
    try:
        import gguf
        r = gguf.GGUFReader(str(model))
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        heads = r.fields[f"{arch}.attention.head_count"]
        n_head = int(heads.parts[heads.data[0]][0])
    except (OSError, ValueError, ImportError, KeyError, IndexError) as e:
        raise CountError(f"{model}: cannot read its tensors and head count ({e})") from e
    return Model({t.name: t.tensor_type.name for t in r.tensors}, n_head)


def spark_op_kernels(op: str, n_head: int) -> int:
    """CUDA launches of one Spark op at one token (module docstring)."""
    if op == "spark_attn":
        return 2 if n_head <= ATTN_FUSED_MAX_QUERIES else 3
    return SPARK_OP_KERNELS[op]


def weight_type(types: dict, shown: str):
    """The type of the weight the log names `shown` (names are cut to 20 characters)."""
    hits = {ty for name, ty in types.items() if name.startswith(shown)}
    return hits.pop() if len(hits) == 1 else None


def spark_op(node: Node, by_name: dict) -> str:
    """Which Spark op a CUSTOM node is, from the graph's names (spark-gemma2.cpp's cb names)."""
    if node.name.startswith("spark_attn"):
        return "spark_attn"
    if node.name.startswith("Qcur"):
        return "spark_rope"
    if node.name.startswith("spark_ffn_partial") or node.name.startswith("spark_ffn_sparse"):
        return "spark_ffn_fused"
    src = by_name.get(node.srcs[0]) if node.srcs else None
    if src is not None and src.op == "CUSTOM" and src.name.startswith("spark_ffn_partial"):
        return "spark_ffn_sum"
    raise CountError(f"node #{node.number} ({node.name}): a CUSTOM node of no known Spark op")


def count(nodes: list, model: Model) -> dict:
    """{layer: Counter(kind -> kernels)} following the module docstring's model. A node named
    with a layer suffix (`attn_norm-3`) belongs to that layer, one without to the layer of the
    last suffixed node before it, up to the layer's output `l_out-N`; the rest (the embedding's
    scale, the output norm and product) to layer -1."""
    by_name = {n.name: n for n in nodes}
    users = Counter(s for n in nodes for s in n.srcs)
    out: dict = {}
    layer, ended = -1, False
    i = 0
    while i < len(nodes):
        n = nodes[i]
        m = LAYER_RE.search(n.name)
        if m:
            layer = int(m.group(1))
        elif ended:
            layer = -1
        nxt = nodes[i + 1] if i + 1 < len(nodes) else None
        nxt2 = nodes[i + 2] if i + 2 < len(nodes) else None
        kernels, kind, used = 1, n.op.lower(), 1
        if n.op == "RMS_NORM" and nxt is not None and nxt.op == "MUL" and n.name in nxt.srcs:
            used = 2
            kind = "rms_norm+mul"
            if nxt2 is not None and nxt2.op == "ADD" and nxt.name in nxt2.srcs:
                used, kind = 3, "rms_norm+mul+add"
        elif (n.op == "ROPE" and nxt is not None and nxt.op == "SET_ROWS" and nxt.number == n.number + 2
              and f"{n.name} (view)" in nxt.srcs and users[n.name] <= 1):
            used, kind = 2, "rope+set_rows"
        elif n.op == "MUL_MAT":
            ty = weight_type(model.types, n.srcs[0]) if n.srcs else None
            quantized = ty is not None and ty not in UNQUANTIZED
            # (the log names a GLU node by its kind: GEGLU, SWIGLU, ...)
            if nxt is not None and nxt.op == "MUL_MAT" and nxt2 is not None and nxt2.op.endswith("GLU"):
                used, kind = 3, "mul_mat x2+glu"
            kernels = 2 if quantized else 1
        elif n.op == "CUSTOM":
            op = spark_op(n, by_name)
            kernels, kind = spark_op_kernels(op, model.n_head), op
        out.setdefault(layer, Counter())[kind] += kernels
        ended = any(x.name.startswith("l_out-") for x in nodes[i:i + used])
        i += used
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        try:
            text = a.log.read_text(errors="replace")
        except OSError as e:
            raise CountError(f"{a.log}: {e}") from e
        per_layer = count(parse_nodes(text), read_model(a.model))
    except CountError as e:
        print(f"cuda-kernel-count: {e}", file=sys.stderr)
        return 1
    layers = sorted(k for k in per_layer if k >= 0)
    totals = {l: sum(per_layer[l].values()) for l in layers}
    if a.json:
        print(json.dumps({"layers": {str(l): dict(per_layer[l]) for l in layers},
                          "per_layer": totals,
                          "outside_layers": sum(per_layer.get(-1, Counter()).values())}))
        return 0
    for l in layers:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(per_layer[l].items()) if v)
        print(f"layer {l}: {totals[l]} kernels ({parts})")
    if layers:
        body = [totals[l] for l in layers[:-1]] or [totals[layers[-1]]]
        print(f"per layer: {min(body)}-{max(body)} kernels (the last layer also gathers the output rows); "
              f"outside the layers: {sum(per_layer.get(-1, Counter()).values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
