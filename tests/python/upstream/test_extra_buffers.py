"""llama.cpp's extra CPU buffer types against plain buffers, as a user checks a machine: the same
file through llama-perplexity with the default (AMX on Xeons with AMX_INT8, CPU_REPACK's SIMD
layouts for q4_0, q4_K, ... on AVX2 and ARM) and with `-nr` (every weight in a plain buffer).
Both compute the same quantized dot products in another order of float sums, so their logits
agree to rounding; a kernel or a layout that is wrong for a weight (patch 0018: Gemma 3n's 3-D
weights on AMX gave KLD 7.5) does not. At -ub 512 (the batched kernels), 1 (the one-row ones)
and 17 (a partial AMX tile). Where no extra type takes a weight of the file on this CPU (q8_0 on
x86 without AMX), the case is skipped and says so.

Bounds: measured on CPU_REPACK (AMD EPYC, AVX-512, 2026-12-06), default against -nr: the
shipped spark-gemma2 (with the plugin; discontinuous where the statistical top-k sits, so a
rounding flips a kept neuron now and then) 6.8e-5 (q4_0) and 0.99-1.1e-4 (q4_k_m) mean KLD,
98.4-99.6 % same top; Gemma-2 of the shipped weights, q4_0: 1.5e-4 and 98.4 %. More than sum
order alone would give: a product that differs in its last bits now and then flips the
quantized rounding of a later product's input, as ggml's own plain kernels do between each
other (the -nr runs at another ubatch differ from -nr at 512 by as much: tests/python/gemma3n,
tests/python/upstream/test_real_models.py). On real AMX tiles (Intel Xeon, 2026-12-06, after
patch 0020 made them run): stock Gemma-2 q8_0 at -ub 512 1.09e-4 mean KLD, 96.85 % same top (8
of 254 scored tokens: near-ties flipped by rounding-level differences of the same size as
CPU_REPACK's). Bounds for both: 1e-3 mean KLD and 95 % same top (254 scored tokens, 2 chunks of
128: a changed top token is 0.39 %); a wrong kernel gives KLD of 1 and more."""

from __future__ import annotations

import pytest

from upstream_helpers import HELDOUT, assert_extra_buffers_agree, extra_buffers_vs_plain, \
    llama_quantize

UBATCHES = ["512", "1", "17"]
MEAN_KLD, SAME_TOP = 1e-3, 95.0
ARGS = ["-f", HELDOUT, "-c", "256", "--chunks", "2", "-b", "256"]


@pytest.mark.parametrize("ub", UBATCHES)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K_M"])
def test_spark_gemma2_extra_buffers_agree_with_plain(shipped_quantized, qtype, ub, tmp_path):
    res, extra = extra_buffers_vs_plain(shipped_quantized(qtype), tmp_path, ub, *ARGS)
    assert_extra_buffers_agree(res, extra, MEAN_KLD, SAME_TOP, f"spark-gemma2 {qtype} -ub {ub}")


@pytest.fixture(scope="module")
def stock_gemma2_quantized(stock_gemma2, tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma2-q")
    made = {}

    def get(qtype: str):
        if qtype not in made:
            made[qtype] = d / f"gemma2-{qtype}.gguf"
            llama_quantize(stock_gemma2, made[qtype], qtype)
        return made[qtype]
    return get


@pytest.mark.parametrize("ub", UBATCHES)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_stock_gemma2_extra_buffers_agree_with_plain(stock_gemma2_quantized, qtype, ub, tmp_path):
    res, extra = extra_buffers_vs_plain(stock_gemma2_quantized(qtype), tmp_path, ub, *ARGS,
                                        with_plugin=False)
    assert_extra_buffers_agree(res, extra, MEAN_KLD, SAME_TOP, f"gemma2 {qtype} -ub {ub}")
