"""The CUDA kernels of a decode step, read from the graph llama.cpp builds (NVIDIA GPUs issue,
item 3: a per-layer kernel budget checked without a GPU).

The shipped model, quantized to Q8_0 by llama-quantize (quantized weights: each matrix-vector
product is an activation quantization and a product on ggml-cuda), runs one decode step with
the plugin under GGML_SCHED_DEBUG=2; tools/cuda-kernel-count.py counts what ggml-cuda would
launch for every node of that graph (its fusions, Spark's ops from their CUDA plans). The graph's
layer structure does not depend on the model's sizes, so the count is that of Gemma-2 2B's
shapes. The budget, the issue's: 19 kernels per decode layer (one stacked Q/K/V product, Q's
two rotary embeddings and scale as one spark_rope, K's last rope fused with its cache store).
Stock Gemma-2's graph, through the same model, takes 22 (docs/PERF.md)."""

from __future__ import annotations

import importlib.util
import sys

from upstream_helpers import CFG, ROOT, THREADS, run, tool, tool_env

SCRIPT = ROOT / "tools" / "cuda-kernel-count.py"
BUDGET = 19


def kernel_count():
    spec = importlib.util.spec_from_file_location("cuda_kernel_count", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_decode_layer_kernel_budget(shipped_quantized):
    model = shipped_quantized("Q8_0")
    env = {**tool_env(True, stats=False), "GGML_SCHED_DEBUG": "2"}
    res = run([tool("llama-completion"), "-m", model, "-p", "To be", "-n", 2, "--temp", "0",
               "-t", THREADS, "-no-cnv", "--no-warmup", "-v"], env=env)
    kc = kernel_count()
    nodes = kc.parse_nodes(res.stderr + res.stdout)
    per_layer = kc.count(nodes, kc.weight_types(model))
    layers = [l for l in sorted(per_layer) if l >= 0]
    assert layers == list(range(CFG["n_layers"])), res.explain(f"layers counted: {layers}")
    totals = {l: sum(per_layer[l].values()) for l in layers}
    print(f"CUDA kernels per decode layer (model of ggml-cuda): {totals}")
    for l in layers[:-1]:  # the last layer also gathers the output rows
        c = per_layer[l]
        assert totals[l] <= BUDGET, f"layer {l}: {totals[l]} kernels > {BUDGET}: {dict(c)}"
        # what the budget rests on: one Q/K/V product, Q's one rope op, K's rope fused with its
        # store, the Spark ops (no CPU-only sum node counted)
        assert c["mul_mat"] == 6 and c["rope+set_rows"] == 1 and c["rope"] == 1, dict(c)
        assert c["spark_rope"] == 1, dict(c)
        assert c["spark_attn"] == 3 and c["spark_ffn_fused"] == 2, dict(c)


def test_a_log_without_node_lines_is_one_line_and_exit_1(tmp_path, shipped_quantized):
    import subprocess
    log = tmp_path / "run.log"
    log.write_text("llama_context: graph splits = 1\n")
    p = subprocess.run([sys.executable, SCRIPT, log, "--model", shipped_quantized("Q8_0")],
                       capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == "", p
    assert p.stderr == "cuda-kernel-count: no GGML_SCHED_DEBUG=2 node lines (run with -v)\n", p.stderr
