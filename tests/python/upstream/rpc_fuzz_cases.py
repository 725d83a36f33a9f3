"""The cases of the RPC fuzz test (test_rpc_fuzz.py): written hostile Spark nodes, aliasing and
graphs of unusual shape, good nodes computed and checked, hostile messages for every command of
the patched protocol (7.2: patch 0009's CUSTOM_OP_SUPPORTED, patch 0013's extra buffer types),
and seeded random mutations of good nodes.

A case either gives a Spark node to send as a graph (`node(rng)`, placed by rpc_fuzz_specs.Placed
between guard bytes; `graph` may change the list of nodes sent) or speaks to the server itself
(`raw(client)`) and returns its outcome. `command` is the RPC command the case attacks (for the
tallies); `expect` the outcomes that pass; `why` what the op's line must say (a regex) when the
outcome is nan; `check` compares a computed node with its numpy reference; `deterministic`
False exempts a case from the second run with other guard bytes."""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
from dataclasses import dataclass

import numpy as np

from upstream_helpers import sibling_module

rpc = sibling_module("spark_rpc_client", "rpc_client.py")
specs = sibling_module("spark_rpc_fuzz_specs", "rpc_fuzz_specs.py")
from spark_rpc_fuzz_specs import (  # noqa: E402
    AH, AK, AKV, AN, ANKV, AR, AS, AT, D, F, GOOD, OPS, P, T, TS, TYPES, W, Node, Placed,
    dequantized, ffn_partials, ffn_u, ggml_nbytes, good_attn, good_up, ne4, quantized,
    rand_values, reference, strides)

# The seed of the cases' data and mutations, and how many mutations: CI's are fixed; a longer
# search is SPARK_FUZZ_SEED=7 SPARK_FUZZ_MUTATIONS=2000.
SEED = int(os.environ.get("SPARK_FUZZ_SEED", "36"))
N_MUTATIONS = int(os.environ.get("SPARK_FUZZ_MUTATIONS", "200"))
CASE_TIMEOUT = 10.0  # seconds a case may take before it counts as a hang

# Outcomes. refused: ggml-rpc refused the message (closed the connection, or answered that it
# did not do it: no buffer, not supported, result 0); answered: a command that is not a graph
# was served and its answer checked; nan: the Spark op refused its arguments (NaN and its one
# line); ran: the graph ran and gave finite output; checked: a graph ran and its output is its
# numpy reference's. upstream-abort / upstream-crash / crash: the server died.
REFUSED, ANSWERED, NAN, RAN, CHECKED = "refused", "answered", "nan", "ran", "checked"
ABORT, CRASH = "upstream-abort", "upstream-crash"
PARTLY_NAN, UNTOUCHED = "partly nan", "untouched"
ONLY_NAN, ONLY_REFUSED = frozenset({NAN}), frozenset({REFUSED})
ONLY_ANSWERED, ONLY_CHECKED = frozenset({ANSWERED}), frozenset({CHECKED})
ANY_SAFE = frozenset({REFUSED, NAN, PARTLY_NAN, RAN, CHECKED})


@dataclass
class Case:
    name: str
    expect: frozenset
    node: object = None
    raw: object = None
    why: str | None = None
    command: int = rpc.GRAPH_COMPUTE
    graph: object = None  # placed node -> the node list sent (default: [node])
    deterministic: bool = True  # whether a computed graph gives the same output every run
    check: object = None  # spec -> (numpy reference, tolerance) | None



def change(spec: Node, *, src: int | None = None, **kw) -> Node:
    """`spec` with fields of its node (src None) or of source `src` (or "dst") changed; a
    source whose type, shape or strides change gets random values of its new size."""
    if src is None:
        return dataclasses.replace(spec, **kw)
    if {"type", "ne", "nb"} & set(kw):
        kw.setdefault("values", None)
    if src == "dst":
        return dataclasses.replace(spec, dst=dataclasses.replace(spec.dst, **kw))
    srcs = list(spec.srcs)
    base = srcs[src].dst if isinstance(srcs[src], Node) else srcs[src]
    srcs[src] = dataclasses.replace(base, **{"values": None, **kw})
    return dataclasses.replace(spec, srcs=srcs)


def nan_case(name, op, why, **kw):
    return Case(name, ONLY_NAN, node=lambda rng: change(GOOD[op](rng), **kw), why=why)


def op_case(name, op, expect, **kw):
    return Case(name, expect, node=lambda rng: change(GOOD[op](rng), **kw))


def overflowing_attn(rng):
    """q and dst [8, n, t, 1] whose byte extent wraps around 2^64 while their element count
    fits int64 (ggml_new_tensor's check): n = 2^32 - 1 heads at nb1 = 2^32 - 1 bytes and
    t = 2^27 + 1 tokens at nb2 = 96 bytes reach (2^32 - 2)(2^32 - 1) + 2^27 * 96 = 2^64 + 2
    bytes, so ggml_nbytes() says 34 and ggml-rpc's bounds check passes; k, v and the mask have
    no cache position (n_kv = 0: no byte). Every shape check of the op holds."""
    spec = good_attn(rng)
    n, t = 2**32 - 1, 2**27 + 1
    ne, nb = (AH, n, t, 1), (4, 2**32 - 1, 96, 0)
    q = TS("F32", ne, nb)
    kc = TS("F32", (AH, 1, 0, 1))
    mask = TS("F32", (0, t, 1, 1))
    assert ggml_nbytes(q) == 34 and n * t * AH < 2**63
    return dataclasses.replace(spec, srcs=[q, kc, kc, mask], dst=TS("F32", ne, nb))


def raw_case(name, expect, fn, command):
    return Case(name, expect, raw=fn, command=command)



def cases() -> list[Case]:
    huge = 2**32 - 1
    out = [
        # spark_ffn_up: s [F, T], h [D, T], K2 [D - r, F]; dst u [T, F]
        nan_case("up: scores f16", "spark_ffn_up", r"scores: unsupported type f16", src=0,
                 type="F16"),
        nan_case("up: h q8_0", "spark_ffn_up", r"h: unsupported type q8_0", src=1, type="Q8_0",
                 ne=(D, T)),
        nan_case("up: K2 i32", "spark_ffn_up", r"ffn_up: unsupported type i32", src=2,
                 type="I32"),
        nan_case("up: dst f16 (left as it was)", "spark_ffn_up", r"dst: unsupported type f16",
                 src="dst", type="F16"),
        nan_case("up: s and h disagree on tokens", "spark_ffn_up", r"h: ne", src=0,
                 ne=(F, T + 1)),
        nan_case("up: K2 rows != F", "spark_ffn_up", r"ffn_up: ne", src=2, ne=(W, F - 1)),
        op_case("up: K2 as wide as h (r = 0: legal, Gemma 3n)", "spark_ffn_up",
                frozenset({RAN}), src=2, ne=(D, F)),
        nan_case("up: K2 wider than h (r < 0)", "spark_ffn_up", r"ffn_up width 80 not in",
                 src=2, ne=(D + 16, F)),
        nan_case("up: K2 of width 0 (r = D)", "spark_ffn_up", r"ffn_up width 0 not in",
                 src=2, ne=(0, F)),
        nan_case("up: scores strided (nb0 = 8)", "spark_ffn_up", r"scores: f32 rows not contig",
                 src=0, nb=(8, 8 * F, 8 * F * T, 8 * F * T)),
        # rows closer than a row: cpu_op::enter's overlap check refuses them before the op's own
        nan_case("up: h row stride below its row", "spark_ffn_up", r"args\[1\]: .*overlap",
                 src=1, nb=(4, 4 * D - 4, (4 * D - 4) * T, (4 * D - 4) * T)),
        nan_case("up: scores rows padded", "spark_ffn_up", r"scores rows must be contiguous",
                 src=0, nb=(4, 4 * F + 16, (4 * F + 16) * T, (4 * F + 16) * T)),
        nan_case("up: K2 nb0 not its element", "spark_ffn_up", r"ffn_up: not a packed 2-D",
                 src=2, nb=(8, 8 * W, 8 * W * F, 8 * W * F)),
        nan_case("up: K2 rows overlap", "spark_ffn_up", r"args\[2\]: .*elements overlap",
                 src=2, nb=(4, 4 * W - 4, (4 * W - 4) * F, (4 * W - 4) * F)),
        # (ggml-rpc refuses a row of partial blocks: patch 0017; the op's own check is tested in
        # spark-backend's tests)
        op_case("up: K2 q8_0, a row not whole blocks", "spark_ffn_up", ONLY_REFUSED, src=2,
                type="Q8_0",
                nb=(34, 34 * W // 32 + 34, (34 * W // 32 + 34) * F, (34 * W // 32 + 34) * F)),
        nan_case("up: 3-D h", "spark_ffn_up", r"h: ne", src=1, ne=(D, T, 2)),
        nan_case("up: dst transposed", "spark_ffn_up", r"dst: ne", src="dst", ne=(F, T)),
        nan_case("up: dst rows padded", "spark_ffn_up", r"dst must be contiguous", src="dst",
                 nb=(4, 4 * T + 4, (4 * T + 4) * F, (4 * T + 4) * F)),
        nan_case("up: k = 0", "spark_ffn_up", r"k = 0 \(must be >= 1\)", params=(0, 0, 0, 0.0)),
        nan_case("up: k < 0", "spark_ffn_up", r"k = -7 \(must be >= 1\)",
                 params=(0, -7, 0, 0.0)),
        op_case("up: k = 2^31 - 1 (dense: legal)", "spark_ffn_up", frozenset({RAN}),
                params=(0, 2**31 - 1, 0, 0.0)),
        # params (layer, k, r, softcap, ffn_cutoff, ffn_z): SPARK_FFN_CUTOFF_STD_MUL = 1
        op_case("up: std multiplier (Gemma 3n's cutoff; k unused)", "spark_ffn_up",
                frozenset({RAN}), params=(0, 0, 0, 0.0, 1, 1.6448533535003662)),
        nan_case("up: unknown ffn_cutoff", "spark_ffn_up", r"ffn_cutoff = 7 \(must be",
                 params=(0, F, 0, 0.0, 7, 0.0)),
        nan_case("up: ffn_z NaN", "spark_ffn_up", r"ffn_z = NaN \(must be finite",
                 params=(0, F, 0, 0.0, 1, float("nan"))),
        nan_case("up: ffn_z -inf", "spark_ffn_up", r"ffn_z = -inf \(must be finite",
                 params=(0, F, 0, 0.0, 1, float("-inf"))),
        nan_case("up: no parameter block", "spark_ffn_up", r"carries no Spark parameters",
                 params=None),
        nan_case("up: another tag than SPK1", "spark_ffn_up", r"carries no Spark parameters",
                 magic=b"SPK2"),
        Case("up: K2 missing (src[2] = 0)", ONLY_NAN, why=r"args\[2\]: .*missing tensor",
             node=lambda rng: change(good_up(rng), srcs=good_up(rng).srcs[:2] + [None])),
        # (ggml-rpc refuses a computed node or a source of it without data: patch 0017)
        op_case("up: K2 without data", "spark_ffn_up", ONLY_REFUSED, src=2, place="nodata"),
        op_case("up: dst without data", "spark_ffn_up", ONLY_REFUSED, src="dst",
                place="nodata"),
        op_case("up: no token (T = 0)", "spark_ffn_up", frozenset({RAN, NAN}),
                srcs=[TS("F32", (F, 0)), TS("F32", (D, 0)), TS("F32", (W, F))],
                dst=TS("F32", (0, F))),
        op_case("up: no neuron (F = 0)", "spark_ffn_up", frozenset({RAN, NAN}),
                srcs=[TS("F32", (0, T)), TS("F32", (D, T)), TS("F32", (W, 0))],
                dst=TS("F32", (T, 0))),
        # bytes 24-31 are the call's counters, zero at rest (docs/INTERFACES.md); a client that
        # sends others gets its own output unwritten (the op cannot tell them from a late
        # thread), or written by a thread that found the chunks left: it varies from run to run
        dataclasses.replace(
            op_case("up: a call state left non-zero", "spark_ffn_up",
                    frozenset({NAN, RAN, UNTOUCHED}), call_state=struct.pack("<II", 1000, 1)),
            deterministic=False),
        # spark_ffn_down: u [T, F], V [D, F]; dst [D, T]
        nan_case("down: u f16", "spark_ffn_down", r"u: unsupported type f16", src=0,
                 ne=(T, F), type="F16"),
        nan_case("down: V i32", "spark_ffn_down", r"ffn_down_t: unsupported type i32", src=1,
                 type="I32"),
        nan_case("down: V rows != F", "spark_ffn_down", r"ffn_down_t: ne", src=1,
                 ne=(D, F + 1)),
        nan_case("down: dst rows != T", "spark_ffn_down", r"dst: ne", src="dst",
                 ne=(D, T + 1)),
        nan_case("down: u rows padded", "spark_ffn_down", r"u must be contiguous", src=0,
                 ne=(T, F), nb=(4, 4 * T + 4, (4 * T + 4) * F, (4 * T + 4) * F)),
        nan_case("down: dst nb0 = 8", "spark_ffn_down", r"dst: f32 rows not contiguous",
                 src="dst", nb=(8, 8 * D, 8 * D * T, 8 * D * T)),
        op_case("down: no parameter block (only the layer is read)", "spark_ffn_down",
                frozenset({RAN}), params=None),
        # spark_ffn_fused: s, h, K2, V; dst [D, T, P]
        nan_case("fused: P = F + 1", "spark_ffn_fused", r"1 <= P <= F", src="dst",
                 ne=(D, T, F + 1)),
        op_case("fused: P = 0 (no element)", "spark_ffn_fused", frozenset({NAN, RAN}),
                src="dst", ne=(D, T, 0)),
        nan_case("fused: V rows != F", "spark_ffn_fused", r"ffn_down_t: ne", src=3,
                 ne=(D, F - 1)),
        nan_case("fused: V q4_0 with nb0 wrong", "spark_ffn_fused", r"ffn_down_t: not a packed",
                 src=3, type="Q4_0", nb=(20, 40, 40 * F, 40 * F)),
        nan_case("fused: dst planes padded", "spark_ffn_fused", r"dst must be contiguous",
                 src="dst", nb=(4, 4 * D, 4 * D * T + 64, (4 * D * T + 64) * P)),
        nan_case("fused: k = 0", "spark_ffn_fused", r"k = 0", params=(1, 0, 0, 0.0)),
        # spark_ffn_sum: partials [D, T, P]; dst [D, T]
        nan_case("sum: partials f16", "spark_ffn_sum", r"partials: unsupported type f16", src=0,
                 ne=(D, T, P), nb=None, type="F16"),
        nan_case("sum: partials 4-D", "spark_ffn_sum", r"partials: ne", src=0,
                 ne=(D, T, P, 2), type="F32"),
        nan_case("sum: partials planes padded", "spark_ffn_sum", r"partials: ne",
                 src=0, ne=(D, T, P), type="F32", nb=(4, 4 * D, 4 * D * T + 4,
                                                      (4 * D * T + 4) * P)),
        nan_case("sum: dst rows != T", "spark_ffn_sum", r"dst: ne", src="dst", ne=(D, T + 2)),
        # spark_attn: q [H, N, T, S], k, v [H, KV, n_kv, S], mask [n_kv, >= T, ., .]
        nan_case("attn: q f16", "spark_attn", r"q: unsupported type f16", src=0, type="F16"),
        nan_case("attn: k i32", "spark_attn", r"k: unsupported type i32", src=1, type="I32"),
        op_case("attn: k q8_0, a head of partial blocks", "spark_attn", ONLY_REFUSED, src=1,
                type="Q8_0", nb=(34, 34, 34 * AKV, 34 * AKV * ANKV)),
        nan_case("attn: v i32", "spark_attn", r"v: unsupported type i32", src=2, type="I32"),
        nan_case("attn: mask i32", "spark_attn", r"mask: unsupported type i32", src=3,
                 type="I32"),
        nan_case("attn: dst f16 (left as it was)", "spark_attn", r"dst: unsupported type f16",
                 src="dst", type="F16"),
        nan_case("attn: k head width != q", "spark_attn", r"does not match q", src=1,
                 ne=(AH + 2, AKV, ANKV, AS)),
        nan_case("attn: query heads not a multiple of KV heads", "spark_attn",
                 r"not a multiple of k heads", src=1, ne=(AH, 3, ANKV, AS)),
        nan_case("attn: v shape != k", "spark_attn", r"v \[.*\] differs from k", src=2,
                 ne=(AH, AKV, ANKV + 1, AS)),
        nan_case("attn: dst shape != q", "spark_attn", r"dst \[.*\] differs from q", src="dst",
                 ne=(AH, AN, AT + 1, AS)),
        nan_case("attn: dst elements not adjacent", "spark_attn", r"nb0 = 8", src="dst",
                 nb=(8, 8 * AH, 8 * AH * AN, 8 * AH * AN * AT)),
        # spark_rope: x [AH, AN, AT], positions [AT] i32; params (layer, r, freq_base,
        # freq_scale, scale, reserved)
        nan_case("rope: odd r", "spark_rope", r"r = 3 \(must be even",
                 params=(0, 3, 10000.0, 1.0, 0.5, 0)),
        nan_case("rope: r = H (no second part)", "spark_rope", r"r = 8 \(must be even",
                 params=(0, AH, 10000.0, 1.0, 0.5, 0)),
        nan_case("rope: freq_base 0", "spark_rope", r"freq_base = 0 \(must be finite",
                 params=(0, AR, 0.0, 1.0, 0.5, 0)),
        nan_case("rope: scale NaN", "spark_rope", r"scale = NaN \(must be finite",
                 params=(0, AR, 10000.0, 1.0, float("nan"), 0)),
        nan_case("rope: positions f32", "spark_rope", r"positions: unsupported type f32", src=1,
                 type="F32"),
        nan_case("rope: x nb0 = 8", "spark_rope", r"x: nb", src=0,
                 nb=(8, 8 * AH, 8 * AH * AN, 8 * AH * AN * AT)),
        nan_case("rope: dst not x's shape", "spark_rope", r"x ne .* and dst ne", src="dst",
                 ne=(AH, AN, AT + 1)),
        nan_case("rope: no parameter block", "spark_rope", r"carries no Spark parameters",
                 params=None),
        nan_case("attn: mask shorter than the tokens", "spark_attn", r"mask \[.*\] does not fit",
                 src=3, ne=(ANKV, AT - 1, 1, AS)),
        nan_case("attn: mask heads do not divide N", "spark_attn", r"mask \[.*\] does not fit",
                 src=3, ne=(ANKV, AT, 3, AS)),
        nan_case("attn: r = 0", "spark_attn", r"attention r = 0", params=(2, AK, 0, 0.0)),
        nan_case("attn: r = H (r >= D)", "spark_attn", r"attention r = 8",
                 params=(2, AK, AH, 0.0)),
        nan_case("attn: r = 2^31 - 1", "spark_attn", r"attention r = 2147483647",
                 params=(2, AK, 2**31 - 1, 0.0)),
        nan_case("attn: k = 0", "spark_attn", r"attention k = 0", params=(2, 0, AR, 0.0)),
        nan_case("attn: k < 0", "spark_attn", r"attention k = -1", params=(2, -1, AR, 0.0)),
        nan_case("attn: softcap NaN", "spark_attn", r"softcap = NaN",
                 params=(2, AK, AR, float("nan"))),
        nan_case("attn: softcap < 0", "spark_attn", r"softcap = -1",
                 params=(2, AK, AR, -1.0)),
        nan_case("attn: softcap inf", "spark_attn", r"softcap = inf",
                 params=(2, AK, AR, float("inf"))),
        nan_case("attn: no parameter block", "spark_attn", r"carries no Spark parameters",
                 params=None),
        op_case("attn: mask without data", "spark_attn", ONLY_REFUSED, src=3, place="nodata"),
        op_case("attn: no cache position (n_kv = 0)", "spark_attn", frozenset({RAN, NAN}),
                srcs=[TS("F32", (AH, AN, AT, AS)), TS("F32", (AH, AKV, 0, AS)),
                      TS("F32", (AH, AKV, 0, AS)), TS("F32", (0, AT, 1, AS))]),
        # (ggml-rpc measures a tensor's extent without wrapping: patch 0017; the op's own check,
        # which refused it before, is tested in spark-backend's tests/op_faults.rs)
        Case("attn: ne and nb whose size wraps 2^64", ONLY_REFUSED, node=overflowing_attn),
        op_case("attn: no token, no position, 2^32 - 1 heads, 2^24 streams", "spark_attn",
                frozenset({RAN, NAN}),
                srcs=[TS("F32", (AH, huge, 0, 2**24)), TS("F32", (AH, 1, 0, 2**24)),
                      TS("F32", (AH, 1, 0, 2**24)), TS("F32", (0, 0, 1, 1))],
                dst=TS("F32", (AH, huge, 0, 2**24))),
        op_case("down: no token, D = 0, F = 2^32 - 1", "spark_ffn_down", frozenset({RAN, NAN}),
                srcs=[TS("F32", (0, huge)), TS("F32", (0, huge))], dst=TS("F32", (0, 0))),
        nan_case("sum: dst rows at a stride of 0, 2^31 + 1 of them", "spark_ffn_sum",
                 r"dst: .*elements overlap", src="dst", ne=(D, 2**31 + 1), nb=(4, 0, 256, 256)),
        op_case("sum: D = 0, 2^32 - 1 tokens and chunks", "spark_ffn_sum", frozenset({RAN, NAN}),
                srcs=[TS("F32", (0, huge, huge))], dst=TS("F32", (0, huge))),
        # ggml-cpu skips a node with no element (ggml_is_empty): the op is not called
        op_case("up: dst of no element, 2^32 - 1 rows of each", "spark_ffn_up",
                frozenset({RAN}), src="dst", ne=(0, huge, huge, huge)),
        # what ggml-rpc refuses before a Spark op runs (the views and huge tensors ended the
        # server on an assert before patch 0017)
        op_case("unknown op id", "spark_ffn_up", ONLY_REFUSED, op_id=0x0123456789ABCDEF),
        op_case("op id 0 (no function)", "spark_ffn_up", ONLY_REFUSED, op_id=0),
        op_case("a Spark name in other case", "spark_ffn_up", ONLY_REFUSED,
                op_id=rpc.fnv1a64("SPARK_FFN_UP")),
        op_case("map_custom1 node", "spark_ffn_sum", ONLY_REFUSED, ggml_op="MAP_CUSTOM1"),
        op_case("n_tasks = 0", "spark_ffn_sum", frozenset({RAN}), n_tasks=0),
        op_case("a source of an unknown type (GGML_TYPE_COUNT)", "spark_ffn_up", ONLY_REFUSED,
                src=2, type=TYPES["COUNT"], nb=(4, 4 * W, 4 * W * F, 4 * W * F)),
        op_case("a source of a removed type (Q4_2, block 0)", "spark_ffn_up", ONLY_REFUSED,
                src=2, type=4, nb=(4, 4 * W, 4 * W * F, 4 * W * F)),
        op_case("a source in a foreign buffer", "spark_ffn_up", ONLY_REFUSED, src=1,
                place="foreign"),
        op_case("a view past its buffer", "spark_ffn_up", ONLY_REFUSED, src=2, place="past_end"),
        op_case("a view before its buffer", "spark_ffn_up", ONLY_REFUSED, src=1,
                place="before_start"),
        op_case("huge ne in a buffer (more than int64 elements)", "spark_ffn_up", ONLY_REFUSED,
                src=0, ne=(huge, huge), nb=(4, 2**32 - 4, 2**32 - 4, 2**32 - 4)),
        op_case("huge ne in a buffer", "spark_ffn_up", ONLY_REFUSED, src=1, ne=(D, huge),
                nb=(4, 4 * D, 4 * D * huge, 4 * D * huge)),
        op_case("dst past its buffer", "spark_ffn_sum", ONLY_REFUSED, src="dst",
                place="past_end"),
    ]
    out += raw_cases()
    return out



# ---------------------------------------------------------------------------------------------
# good nodes computed and checked, f32 and quantized weights with their own strides


def u_given(make):
    """A spark_ffn_down good node with u given as values (not another node's output)."""
    def build(rng):
        spec = make(rng)
        u = TS("F32", (T, F), values=rand_values(rng, TS(ne=(T, F))))
        return dataclasses.replace(spec, srcs=[u, *spec.srcs[1:]])
    return build


def checked_cases() -> list[Case]:
    out = []
    for label, make in GOOD.items():
        if label == "spark_ffn_sum":
            continue  # (its partials are another node's: the two-node graph case checks it)
        if label.startswith("spark_ffn_down"):
            make = u_given(make)
        out.append(Case(f"good: {label}", ONLY_CHECKED, node=make, check=reference))
    return out


# ---------------------------------------------------------------------------------------------
# aliasing: a node's dst over one of its sources, or two sources over the same bytes


def plain(src) -> TS:
    return src.dst if isinstance(src, Node) else src


def aliased(label: str, dst_over: int | None = None, src_over: tuple | None = None):
    """GOOD[label] with its dst sharing the bytes of source `dst_over`, or source i sharing the
    bytes of source j (src_over = (i, j))."""
    def build(rng):
        spec = GOOD[label](rng)
        srcs = list(spec.srcs)
        if src_over is not None:
            i, j = src_over
            srcs[i] = dataclasses.replace(plain(srcs[i]), alias=plain(srcs[j]), values=None)
        dst = spec.dst if dst_over is None \
            else dataclasses.replace(spec.dst, alias=plain(srcs[dst_over]))
        return dataclasses.replace(spec, srcs=srcs, dst=dst)
    return build


def alias_cases() -> list[Case]:
    table = [
        ("up writes u over h", "spark_ffn_up", 1, None),
        ("up writes u over its scores", "spark_ffn_up", 0, None),
        ("up's K2 is h's bytes", "spark_ffn_up", None, (2, 1)),
        ("up q4_K writes u over its K2", "spark_ffn_up q4_k", 2, None),
        ("fused writes its partials over V", "spark_ffn_fused", 3, None),
        ("fused's V is K2's bytes", "spark_ffn_fused", None, (3, 2)),
        ("fused q4_0 writes its partials over h", "spark_ffn_fused q4_0", 1, None),
        ("sum writes over its partials", "spark_ffn_sum", 0, None),
        ("down writes over V", "spark_ffn_down", 1, None),
        ("down q8_0's V is u's bytes", "spark_ffn_down q8_0", None, (1, 0)),
        ("attention writes over q", "spark_attn", 0, None),
        ("attention's v is k", "spark_attn", None, (2, 1)),
        ("attention's mask is k", "spark_attn", None, (3, 1)),
        ("attention f16's k is q", "spark_attn f16 cache", None, (1, 0)),
    ]
    return [Case(f"alias: {name}", ANY_SAFE, node=aliased(label, dst_over, src_over))
            for name, label, dst_over, src_over in table]


# ---------------------------------------------------------------------------------------------
# graphs of unusual shape: repeated nodes, self-loops, cycles


def self_source(slot: int):
    def graph(node):
        node.src[slot] = node
        return [node]
    return graph


def each_others_source(node):
    """down's u is up's output (its source node); up's h becomes down's output."""
    up = node.src[0]
    up.src[1] = node
    return [up, node]


def with_sources(node):
    return [node.src[0], node]


def sum_of_partials(spec):
    return ffn_partials(spec.srcs[0]).sum(0), 1e-5


def graph_cases() -> list[Case]:
    return [
        Case("graph: a Spark node listed twice", ONLY_CHECKED, node=GOOD["spark_ffn_up"],
             graph=lambda n: [n, n], check=reference),
        Case("graph: a Spark node listed 1 000 times", frozenset({RAN}),
             node=GOOD["spark_ffn_sum"], graph=lambda n: [n] * 1000),
        Case("graph: the fused node and its sum", ONLY_CHECKED, node=GOOD["spark_ffn_sum"],
             graph=with_sources, check=sum_of_partials),
        Case("graph: a Spark node whose source is itself", ANY_SAFE,
             node=GOOD["spark_ffn_up"], graph=self_source(1)),
        # (its dst [D, T] read as partials is one chunk of D x T: the sum is the copy onto
        # itself, dst as it was)
        Case("graph: a Spark node whose dst is its only source", ANY_SAFE | {UNTOUCHED},
             node=GOOD["spark_ffn_sum"], graph=self_source(0)),
        Case("graph: two Spark nodes, each the other's source", ANY_SAFE,
             node=GOOD["spark_ffn_down"], graph=each_others_source),
        Case("graph: a source's op out of range", ONLY_REFUSED, node=GOOD["spark_ffn_up"],
             graph=lambda n: [dataclasses.replace(n, src=[n.src[0], dataclasses.replace(
                 n.src[1], op=0xFFFF), n.src[2]])]),
        Case("graph: a node whose op is GGML_OP_COUNT", ONLY_REFUSED,
             node=GOOD["spark_ffn_up"],
             graph=lambda n: [dataclasses.replace(n, op=OPS["COUNT"])]),
        Case("graph: node id 0 in the list", ONLY_REFUSED, node=GOOD["spark_ffn_up"],
             graph=lambda n: [n, 0]),
        op_case("graph: a source of q8_0 whose rows are not whole blocks", "spark_ffn_up",
                ONLY_REFUSED, src=2, type="Q8_0", ne=(W, F),
                nb=(34, 34 * 2, 34 * 2 * F, 34 * 2 * F)),
    ]



# ---------------------------------------------------------------------------------------------
# every command of the protocol, hostile and good (a good one's answer is checked)


def buffer_of(c, size: int = 4096) -> tuple[int, int, int]:
    """(remote buffer, base address, size) of a new buffer of the connection."""
    remote, n = c.alloc_buffer(size)
    return remote, c.buffer_base(remote), n


def f32s(remote: int, data: int, n: int = 4, name: str = "") -> rpc.Tensor:
    """n f32 elements at `data` in buffer `remote`."""
    return rpc.Tensor(TYPES["F32"], (n, 1, 1, 1), (4, 4 * n, 4 * n, 4 * n), buffer=remote,
                      data=data, name=name)


def served(c, outcome: str = ANSWERED) -> str:
    """`outcome` when the connection still serves a command, else what it did."""
    try:
        c.alignment()
    except (rpc.Closed, OSError) as e:
        return f"connection lost after an answer: {e!r}"
    return outcome


def answer(ok: bool, what: str) -> str:
    return ANSWERED if ok else f"wrong answer: {what}"


def greeted(fn):
    """A raw case that starts with HELLO and returns fn(client)."""
    def go(c):
        hello(c)
        return fn(c)
    return go


def refused_by_answer(done: bool) -> str:
    """A command answered with 'not done' (no buffer, not supported, result 0) was refused."""
    return REFUSED if not done else "done"


def command_cases() -> list[Case]:
    A = rpc

    def clear_checked(c):
        remote, base, n = buffer_of(c)
        c.buffer_clear(remote, 0x77)
        got = c.get_tensor(rpc.Tensor(TYPES["I8"], (n, 1, 1, 1), (1, n, n, n), buffer=remote,
                                      data=base), n)
        return answer(got == b"\x77" * n, "buffer_clear did not set every byte")

    def freed_twice(c):
        remote, _, _ = buffer_of(c)
        c.free_buffer(remote)
        c.alignment()
        c.free_buffer(remote)
        return expect_closed(c)

    def set_at(offset: int, size: int, data_delta: int = 0):
        def go(c):
            remote, base, _ = buffer_of(c)
            c.set_tensor(f32s(remote, base + data_delta), bytes(size), offset)
            return expect_closed(c)
        return go

    def get_at(offset: int, size: int, data_delta: int = 0):
        def go(c):
            remote, base, _ = buffer_of(c)
            t = f32s(remote, base + data_delta)
            c.send(rpc.GET_TENSOR, t.pack() + struct.pack("<QQ", offset, size))
            return expect_closed(c)
        return go

    def memset_at(offset: int, size: int, data_delta: int = 0):
        def go(c):
            remote, base, _ = buffer_of(c)
            c.memset_tensor(f32s(remote, base + data_delta), offset, size, 0x33)
            return expect_closed(c)
        return go

    def memset_checked(c):
        remote, base, _ = buffer_of(c)
        c.buffer_clear(remote, 0)
        t = f32s(remote, base + 64, 8)
        c.memset_tensor(t, 8, 16, 0x33)
        got = c.get_tensor(rpc.Tensor(TYPES["I8"], (96, 1, 1, 1), (1, 96, 96, 96),
                                      buffer=remote, data=base), 96)
        want = bytes(72) + b"\x33" * 16 + bytes(8)
        return answer(got == want, "memset_tensor wrote elsewhere")

    def copy_of(src_delta: int, dst_delta: int, n_src: int = 16, n_dst: int = 16,
                src_buffer: int | None = None):
        def go(c):
            remote, base, size = buffer_of(c)
            c.buffer_clear(remote, 0)
            src = f32s(remote if src_buffer is None else src_buffer, base + src_delta, n_src)
            dst = f32s(remote, base + dst_delta, n_dst)
            values = np.arange(n_src, dtype="<f4").tobytes()
            if src_buffer is None:
                c.set_tensor(src, values)
            c.send(rpc.COPY_TENSOR, src.pack() + dst.pack())
            if dst_delta + 4 * n_src > size or src_buffer is not None or n_src != n_dst \
                    or abs(dst_delta - src_delta) < 4 * n_src:
                return expect_closed(c)
            if c.reply(1) == b"\0":
                return REFUSED
            got = c.get_tensor(dst, 4 * n_dst)
            return answer(got == values, "copy_tensor copied something else")
        return go

    def init_past_end(c):
        remote, base, size = buffer_of(c)
        c.init_tensor(f32s(remote, base + size))
        return expect_closed(c)

    def alloc_size_checked(c):
        t = rpc.Tensor(TYPES["Q8_0"], (64, 3, 1, 1), (34, 68, 204, 204))
        return answer(c.get_alloc_size(t) >= 204, "alloc size below ggml_nbytes")

    def custom_op_checked(c):
        return answer(c.custom_op_supported("spark_ffn_up")
                      and not c.custom_op_supported("no_such_op"), "custom op answers")

    def hash_cases():
        """SET_TENSOR_HASH needs the server's cache (started with --cache): a SET_TENSOR with
        the cache flag saves 64 bytes under their hash, which the cases then name."""
        data = np.arange(16, dtype="<f4").tobytes()
        digest = rpc.fnv1a64_bytes(data)

        def saved(c):
            remote, base, _ = buffer_of(c)
            c.set_tensor_cached(f32s(remote, base, 16), data)
            return remote, base

        def unknown_hash(c):
            remote, base, _ = buffer_of(c)
            return served(c, refused_by_answer(
                c.set_tensor_hash(f32s(remote, base, 16), 0, digest ^ 1)))

        def into(n: int, offset: int, data_delta: int = 0):
            def go(c):
                remote, base = saved(c)
                t = f32s(remote, base + 256 + data_delta, n)
                c.send(rpc.SET_TENSOR_HASH, t.pack() + struct.pack("<QQ", offset, digest))
                return expect_closed(c)
            return go

        def good(c):
            remote, base = saved(c)
            t = f32s(remote, base + 256, 16)
            if not c.set_tensor_hash(t, 0, digest):
                return "the server did not have the data it saved (started without --cache?)"
            return answer(c.get_tensor(t, 64) == data, "set_tensor_hash wrote other bytes")

        H = rpc.SET_TENSOR_HASH
        return [(H, "an unknown hash", ONLY_REFUSED, greeted(unknown_hash)),
                (H, "a known hash into a 4-element tensor", ONLY_REFUSED, greeted(into(4, 0))),
                (H, "a known hash at an offset past its tensor", ONLY_REFUSED,
                 greeted(into(16, 8))),
                (H, "a known hash past the buffer", ONLY_REFUSED,
                 greeted(into(16, 0, 4096 - 256 - 32))),
                (H, "a known hash, checked", ONLY_ANSWERED, greeted(good))]

    huge = rpc.Tensor(TYPES["F32"], (2**32 - 1, 2**32 - 1, 1, 1), (4, 2**32 - 4, 0, 0))
    table = [  # (command, name, expected outcomes, the case)
        (A.ALLOC_BUFFER, "device 7", ONLY_REFUSED,
         sends((A.ALLOC_BUFFER, struct.pack("<IQ", 7, 64)))),
        (A.GET_ALIGNMENT, "device 7", ONLY_REFUSED,
         sends((A.GET_ALIGNMENT, struct.pack("<I", 7)))),
        (A.GET_MAX_SIZE, "device 7", ONLY_REFUSED, sends((A.GET_MAX_SIZE, struct.pack("<I", 7)))),
        (A.BUFFER_GET_BASE, "unknown buffer", ONLY_REFUSED,
         sends((A.BUFFER_GET_BASE, struct.pack("<Q", 0xDEAD0000)))),
        (A.FREE_BUFFER, "freed twice", ONLY_REFUSED, greeted(freed_twice)),
        (A.BUFFER_CLEAR, "unknown buffer", ONLY_REFUSED,
         sends((A.BUFFER_CLEAR, struct.pack("<QB", 0xDEAD0000, 1)))),
        (A.BUFFER_CLEAR, "a buffer, checked", ONLY_ANSWERED, greeted(clear_checked)),
        (A.SET_TENSOR, "a tensor before its buffer", ONLY_REFUSED, greeted(set_at(0, 4, -64))),
        (A.SET_TENSOR, "an offset past its tensor", ONLY_REFUSED, greeted(set_at(32, 4))),
        (A.SET_TENSOR, "an offset of 2^64 - 8", ONLY_REFUSED, greeted(set_at(2**64 - 8, 4))),
        (A.GET_TENSOR, "past its tensor, inside the buffer", ONLY_REFUSED,
         greeted(get_at(0, 64))),
        (A.GET_TENSOR, "a tensor before its buffer", ONLY_REFUSED, greeted(get_at(0, 4, -64))),
        (A.GET_TENSOR, "2^64 - 1 bytes", ONLY_REFUSED, greeted(get_at(0, 2**64 - 1))),
        (A.GET_TENSOR, "an offset of 2^64 - 8", ONLY_REFUSED, greeted(get_at(2**64 - 8, 8))),
        (A.COPY_TENSOR, "into the last bytes of the buffer", ONLY_REFUSED,
         greeted(copy_of(0, 4096 - 32))),
        (A.COPY_TENSOR, "from an unknown buffer", ONLY_REFUSED,
         greeted(copy_of(0, 128, src_buffer=0xDEAD0000))),
        # (patch 0017: a copy moves a tensor's bytes onto another of the same size, apart)
        (A.COPY_TENSOR, "into a smaller tensor", ONLY_REFUSED, greeted(copy_of(0, 128, 16, 4))),
        (A.COPY_TENSOR, "between overlapping tensors", ONLY_REFUSED, greeted(copy_of(0, 16))),
        (A.COPY_TENSOR, "checked", ONLY_ANSWERED, greeted(copy_of(0, 128))),
        (A.GET_DEVICE_MEMORY, "device 7", ONLY_REFUSED,
         sends((A.GET_DEVICE_MEMORY, struct.pack("<I", 7)))),
        (A.GET_DEVICE_MEMORY, "checked", ONLY_ANSWERED,
         greeted(lambda c: answer(0 < c.device_memory()[1], "total memory 0"))),
        (A.INIT_TENSOR, "a tensor past its buffer", ONLY_REFUSED, greeted(init_past_end)),
        (A.INIT_TENSOR, "a tensor without a buffer", ONLY_ANSWERED,
         greeted(lambda c: (c.init_tensor(f32s(0, 0)), served(c))[1])),
        (A.GET_ALLOC_SIZE, "device 7", ONLY_REFUSED,
         greeted(lambda c: (c.send(A.GET_ALLOC_SIZE, struct.pack("<I", 7) + f32s(0, 0).pack()
                                   + rpc.pack_srcs(())), expect_closed(c))[1])),
        (A.GET_ALLOC_SIZE, "more elements than int64_t counts", ONLY_REFUSED,
         greeted(lambda c: (c.send(A.GET_ALLOC_SIZE, struct.pack("<I", 0) + huge.pack()
                                   + rpc.pack_srcs(())), expect_closed(c))[1])),
        (A.GET_ALLOC_SIZE, "checked", ONLY_ANSWERED, greeted(alloc_size_checked)),
        (A.HELLO, "HELLO again", ONLY_REFUSED,
         sends((A.HELLO, bytes(rpc.CONN_CAPS_SIZE)))),
        (A.DEVICE_COUNT, "with 4 bytes of payload", ONLY_REFUSED,
         sends((A.DEVICE_COUNT, bytes(4)))),
        (A.DEVICE_COUNT, "checked", ONLY_ANSWERED,
         greeted(lambda c: answer(c.device_count() == 1, "device count"))),
        (A.MEMSET_TENSOR, "past its tensor", ONLY_REFUSED, greeted(memset_at(8, 16))),
        (A.MEMSET_TENSOR, "a tensor past its buffer", ONLY_REFUSED,
         greeted(memset_at(0, 4, 4096))),
        (A.MEMSET_TENSOR, "checked", ONLY_ANSWERED, greeted(memset_checked)),
        (A.CUSTOM_OP_SUPPORTED, "one byte short", ONLY_REFUSED,
         sends((A.CUSTOM_OP_SUPPORTED, bytes(7)))),
        (A.CUSTOM_OP_SUPPORTED, "checked", ONLY_ANSWERED, greeted(custom_op_checked)),
        (23, "RPC_CMD_NONE", ONLY_REFUSED, sends((23, b""))),
        (24, "RPC_CMD_COUNT", ONLY_REFUSED, sends((24, b""))),
    ]
    table += hash_cases()
    return [raw_case(f"{rpc.COMMANDS.get(cmd, 'command').lower()}: {name}", expect, fn, cmd)
            for cmd, name, expect, fn in table]


# ---------------------------------------------------------------------------------------------
# GRAPH_RECOMPUTE


def recompute_cases() -> list[Case]:
    def computed(c, make=good_up):
        placed = Placed(c, np.random.default_rng(SEED))
        spec = make(np.random.default_rng(SEED + 1))
        c.graph_compute([placed.node(spec)])
        return placed, spec

    def after_new_inputs(c):
        placed, spec = computed(c)
        first = np.frombuffer(placed.read(spec), "<f4").reshape(F, T)
        h = spec.srcs[1]
        h2 = dataclasses.replace(h, values=rand_values(np.random.default_rng(SEED + 2), h))
        c.set_tensor(placed.made[id(h)], h2.values.astype("<f4").tobytes())
        c.graph_recompute()
        got = np.frombuffer(placed.read(spec), "<f4").reshape(F, T)
        want = ffn_u(dataclasses.replace(spec, srcs=[spec.srcs[0], h2, spec.srcs[2]]))
        ok = np.allclose(first, ffn_u(spec), rtol=1e-4, atol=1e-5) \
            and np.allclose(got, want, rtol=1e-4, atol=1e-5)
        return CHECKED if ok else "wrong result after GRAPH_RECOMPUTE"

    def many(c):
        placed, spec = computed(c)
        for _ in range(50):
            c.graph_recompute()
        got = np.frombuffer(placed.read(spec), "<f4").reshape(F, T)
        return CHECKED if np.allclose(got, ffn_u(spec), rtol=1e-4, atol=1e-5) \
            else "wrong result after 50 recomputes"

    def after_free(c):
        placed, _ = computed(c)
        c.free_buffer(placed.arena.remote)
        c.alignment()
        c.graph_recompute()
        return expect_closed(c)

    def refused_graph(c):
        placed, spec = computed(c, lambda rng: change(good_up(rng), params=(0, 0, 0, 0.0)))
        placed.client.set_tensor(placed.made[id(spec)], bytes(placed.regions[id(spec)][1]))
        c.graph_recompute()
        got = np.frombuffer(placed.read(spec), "<f4")
        return NAN if np.isnan(got).all() else "recomputed a refused node into numbers"

    R = rpc.GRAPH_RECOMPUTE
    table = [
        ("device 7", ONLY_REFUSED, sends((R, struct.pack("<I", 7)))),
        ("after its buffer was freed", ONLY_REFUSED, greeted(after_free)),
        ("after new inputs, checked", ONLY_CHECKED, greeted(after_new_inputs)),
        ("50 times, checked", ONLY_CHECKED, greeted(many)),
        ("a node the op refused (k = 0)", ONLY_NAN, greeted(refused_graph)),
    ]
    return [raw_case(f"graph_recompute: {name}", expect, fn, R) for name, expect, fn in table]



# ---------------------------------------------------------------------------------------------
# patch 0013's commands: the server's extra (repacked) buffer types. The cases use ggml-cpu's
# CPU_REPACK type, which every x86-64 CPU with AVX2 offers (q4_0 weights with rows in groups
# of 8); an AMX machine also offers AMX, which the answers to GET_EXTRA_BUFTS list.

REPACK = "CPU_REPACK"
QK, QROWS = 256, 16  # a good q4_0 weight for the repacked kernels: [QK, QROWS]


def repack_index(c) -> int:
    names = [name for name, _, _ in c.extra_bufts()]
    if REPACK not in names:
        raise RuntimeError(f"the server offers no {REPACK} buffer type (it offers {names})")
    return names.index(REPACK) + 1


def q4_0_weight(remote: int, data: int, ne=(QK, QROWS, 1, 1)) -> rpc.Tensor:
    ne = tuple(ne) + (1,) * (4 - len(ne))
    return rpc.Tensor(TYPES["Q4_0"], ne, rpc.contiguous_nb(18, 32, ne), buffer=remote,
                      data=data, name="w")


def mul_mat(w: rpc.Tensor, x: rpc.Tensor, dst: rpc.Tensor, op: str = "MUL_MAT") -> rpc.Tensor:
    return dataclasses.replace(dst, op=OPS[op], src=[w, x], flags=rpc.FLAG_COMPUTE, name=op)


class Repacked:
    """A q4_0 weight [QK, QROWS] written into a CPU_REPACK buffer of the connection, and a plain
    buffer with x [QK, 2] and dst [QROWS, 2] for a matrix product from it."""

    def __init__(self, c, write: bool = True):
        rng = np.random.default_rng(SEED)
        self.c = c
        self.extra = repack_index(c)
        self.remote, self.size = c.alloc_extra_buffer(1 << 16, self.extra)
        assert self.remote, "no CPU_REPACK buffer"
        self.base = c.buffer_base(self.remote)
        self.values = quantized(rng, "Q4_0", QK, QROWS)
        self.w = q4_0_weight(self.remote, self.base)
        if write:
            c.set_tensor(self.w, self.values.tobytes())
        self.plain, _ = c.alloc_buffer(1 << 16)
        pbase = c.buffer_base(self.plain)
        self.xv = rand_values(rng, TS(ne=(QK, 2)))
        self.x = rpc.Tensor(TYPES["F32"], (QK, 2, 1, 1), rpc.contiguous_nb(4, 1, (QK, 2, 1, 1)),
                            buffer=self.plain, data=pbase, name="x")
        c.set_tensor(self.x, self.xv.tobytes())
        self.dst = rpc.Tensor(TYPES["F32"], (QROWS, 2, 1, 1),
                              rpc.contiguous_nb(4, 1, (QROWS, 2, 1, 1)), buffer=self.plain,
                              data=pbase + 4096, name="dst")

    def want(self) -> np.ndarray:
        w = dequantized(TS("Q4_0", (QK, QROWS), values=self.values))  # [QROWS, QK]
        return self.xv.astype(np.float64).reshape(2, QK) @ w.T  # [2, QROWS]


def extra_cases() -> list[Case]:
    X = rpc.EXTRA_SUPPORTS_OP

    def supports(make_op, device: int = 0):
        """EXTRA_SUPPORTS_OP of the op make_op(c, extra) gives: (op, srcs, src_extra)."""
        def go(c):
            op, srcs, src_extra = make_op(c, repack_index(c))
            return served(c, refused_by_answer(c.extra_supports_op(op, srcs, src_extra, device)))
        return go

    def f32(ne):
        ne = tuple(ne) + (1,) * (4 - len(ne))
        return rpc.Tensor(TYPES["F32"], ne, rpc.contiguous_nb(4, 1, ne))

    def no_sources(c, e):  # ggml-cpu's supports_op read src1 of a mul_mat without one
        return dataclasses.replace(f32((QROWS, 1)), op=OPS["MUL_MAT"]), (), ()

    def only_src1(c, e):
        return (dataclasses.replace(f32((QROWS, 1)), op=OPS["MUL_MAT"]),
                (None, q4_0_weight(0, 0)), (0, e))

    def good_mul_mat(c, e, wtype="Q4_0", x_ne=(QK, 1), op="MUL_MAT"):
        w = q4_0_weight(0, 0) if wtype == "Q4_0" else f32((QK, QROWS))
        return dataclasses.replace(f32((QROWS, x_ne[1])), op=OPS[op]), (w, f32(x_ne)), (e,)

    def in_range_answer(c):
        return served(c, answer(c.extra_supports_op(*good_mul_mat(c, repack_index(c))),
                                "a q4_0 mul_mat from CPU_REPACK is not supported"))

    def listed(c):
        names = [n for n, _, _ in c.extra_bufts()]
        return answer(REPACK in names, f"{REPACK} not listed: {names}")

    def alloc(extra: int, size: int = 4096, device: int = 0):
        def go(c):
            c.send(rpc.ALLOC_EXTRA_BUFFER, struct.pack("<IIQ", device, extra, size))
            return expect_closed(c)
        return go

    def alloc_huge(c):
        remote, _ = c.alloc_extra_buffer(1 << 62, repack_index(c))
        return served(c, refused_by_answer(remote != 0))

    def alloc_size(c):
        n = c.get_extra_alloc_size(q4_0_weight(0, 0), repack_index(c))
        return answer(n >= 18 * QK // 32 * QROWS, f"alloc size {n}")

    def alloc_size_of(t, extra=None):
        def go(c):
            e = repack_index(c) if extra is None else extra
            c.send(rpc.GET_EXTRA_ALLOC_SIZE, struct.pack("<II", 0, e) + t.pack())
            return expect_closed(c)
        return go

    def write(make, offset: int = 0, cut: int = 0):
        """SET_TENSOR of make(repacked) into the CPU_REPACK buffer (its whole size less `cut`
        bytes, at `offset`): the server must refuse it."""
        def go(c):
            r = Repacked(c, write=False)
            t = make(r)  # (contiguous: its bytes are nb[3] * ne[3])
            c.set_tensor(t, bytes(t.nb[3] * t.ne[3] - cut), offset)
            return expect_closed(c)
        return go

    def computed(c):
        r = Repacked(c)
        c.graph_compute([mul_mat(r.w, r.x, r.dst)])
        got = np.frombuffer(c.get_tensor(r.dst, 4 * QROWS * 2), "<f4").reshape(2, QROWS)
        want = r.want()
        return CHECKED if np.allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max()) \
            else f"wrong result: max error {np.abs(got - want).max():.3g}"

    def graph_from(make_node):
        def go(c):
            r = Repacked(c)
            c.graph_compute([make_node(r)])
            return expect_closed(c)
        return go

    def read_back(c):
        r = Repacked(c)
        c.send(rpc.GET_TENSOR, r.w.pack() + struct.pack("<QQ", 0, 16))
        return expect_closed(c)

    def memset_it(c):
        r = Repacked(c)
        c.memset_tensor(r.w, 0, 18, 0)
        return served(c)

    def copy_out(c):
        r = Repacked(c)
        dst = dataclasses.replace(r.w, buffer=r.plain, data=c.buffer_base(r.plain) + 8192)
        return served(c, refused_by_answer(c.copy_tensor(r.w, dst)))

    def init_f32(c):
        r = Repacked(c, write=False)
        c.init_tensor(f32s(r.remote, r.base, 16))
        return served(c)

    def unwritten(c):
        r = Repacked(c, write=False)
        c.graph_compute([mul_mat(r.w, r.x, r.dst)])
        got = np.frombuffer(c.get_tensor(r.dst, 4 * QROWS * 2), "<f4")
        return RAN if np.isfinite(got).all() else NAN

    def hashed_at(offset: int):
        def go(c):
            r = Repacked(c, write=False)
            data = r.values.tobytes()
            c.set_tensor_cached(r.w, data)  # a good write, saved under its hash
            c.send(rpc.SET_TENSOR_HASH, r.w.pack()
                   + struct.pack("<QQ", offset, rpc.fnv1a64_bytes(data)))
            return expect_closed(c)
        return go

    G = rpc.GRAPH_COMPUTE
    S = rpc.SET_TENSOR
    table = [  # (command, name, expected outcomes, the case)
        (rpc.GET_EXTRA_BUFTS, "device 7", ONLY_REFUSED,
         sends((rpc.GET_EXTRA_BUFTS, struct.pack("<I", 7)))),
        (rpc.GET_EXTRA_BUFTS, "CPU_REPACK listed", ONLY_ANSWERED, greeted(listed)),
        (rpc.ALLOC_EXTRA_BUFFER, "extra type 0", ONLY_REFUSED, greeted(alloc(0))),
        (rpc.ALLOC_EXTRA_BUFFER, "extra type 9", ONLY_REFUSED, greeted(alloc(9))),
        (rpc.ALLOC_EXTRA_BUFFER, "device 7", ONLY_REFUSED, greeted(alloc(1, device=7))),
        (rpc.ALLOC_EXTRA_BUFFER, "2^62 bytes", ONLY_REFUSED, greeted(alloc_huge)),
        (rpc.GET_EXTRA_ALLOC_SIZE, "extra type 0", ONLY_REFUSED,
         greeted(alloc_size_of(q4_0_weight(0, 0), 0))),
        (rpc.GET_EXTRA_ALLOC_SIZE, "more elements than int64_t counts", ONLY_REFUSED,
         greeted(alloc_size_of(q4_0_weight(0, 0, (2**32 - 32, 2**32 - 1))))),
        (rpc.GET_EXTRA_ALLOC_SIZE, "a q4_0 weight, checked", ONLY_ANSWERED, greeted(alloc_size)),
        (X, "a mul_mat without sources", ONLY_REFUSED, greeted(supports(no_sources))),
        (X, "a mul_mat with only src1, in the extra type", ONLY_REFUSED,
         greeted(supports(only_src1))),
        (X, "an add whose weight is in the extra type", ONLY_REFUSED,
         greeted(supports(lambda c, e: good_mul_mat(c, e, op="ADD")))),
        (X, "a mul_mat of mismatched widths", ONLY_REFUSED,
         greeted(supports(lambda c, e: good_mul_mat(c, e, x_ne=(QK + 32, 1))))),
        (X, "an f32 weight (no repacked layout)", ONLY_REFUSED,
         greeted(supports(lambda c, e: good_mul_mat(c, e, wtype="F32")))),
        (X, "extra type 9", ONLY_REFUSED, greeted(supports(lambda c, e: good_mul_mat(c, 9)))),
        (X, "device 7", ONLY_REFUSED,
         greeted(lambda c: (c.send(X, struct.pack("<I10I", 7, *[0] * 10) + f32((1,)).pack()
                                   + rpc.pack_srcs(())), expect_closed(c))[1])),
        (X, "a q4_0 mul_mat, checked", ONLY_ANSWERED, greeted(in_range_answer)),
        (S, "f32 data into the extra buffer", ONLY_REFUSED,
         greeted(write(lambda r: f32s(r.remote, r.base, 64)))),
        (S, "q4_0 [64, 3] (rows not in groups of 8)", ONLY_REFUSED,
         greeted(write(lambda r: q4_0_weight(r.remote, r.base, (64, 3))))),
        (S, "a q4_0 weight at offset 18", ONLY_REFUSED, greeted(write(lambda r: r.w, 18, 18))),
        (S, "half a q4_0 weight", ONLY_REFUSED,
         greeted(write(lambda r: r.w, 0, 18 * QK // 32 * QROWS // 2))),
        (S, "a 4-D q4_0 weight", ONLY_REFUSED,
         greeted(write(lambda r: q4_0_weight(r.remote, r.base, (QK, 8, 1, 2))))),
        (S, "a q4_0 weight whose end is past the buffer's", ONLY_REFUSED,
         greeted(write(lambda r: q4_0_weight(r.remote, r.base + r.size - 64)))),
        (rpc.SET_TENSOR_HASH, "a cached q4_0 weight at offset 18", ONLY_REFUSED,
         greeted(hashed_at(18))),
        (G, "a mul_mat from a repacked q4_0 weight, checked", ONLY_CHECKED, greeted(computed)),
        (G, "a mul_mat from a weight never written", frozenset({RAN, NAN}), greeted(unwritten)),
        (G, "a mul_mat of mismatched widths from it", ONLY_REFUSED,
         greeted(graph_from(lambda r: mul_mat(r.w, dataclasses.replace(
             r.x, ne=(QK // 2, 4, 1, 1), nb=rpc.contiguous_nb(4, 1, (QK // 2, 4, 1, 1))),
             r.dst)))),
        (G, "a mul_mat writing a wrong dst shape from it", ONLY_REFUSED,
         greeted(graph_from(lambda r: mul_mat(r.w, r.x, dataclasses.replace(
             r.dst, ne=(QROWS, 1, 1, 1)))))),
        (G, "an add reading it", ONLY_REFUSED,
         greeted(graph_from(lambda r: mul_mat(r.w, r.x, r.dst, op="ADD")))),
        (rpc.GET_TENSOR, "a repacked weight", ONLY_REFUSED, greeted(read_back)),
        (rpc.MEMSET_TENSOR, "a repacked weight", ONLY_ANSWERED, greeted(memset_it)),
        (rpc.COPY_TENSOR, "out of the extra buffer", ONLY_REFUSED, greeted(copy_out)),
        (rpc.INIT_TENSOR, "an f32 tensor in the extra buffer", ONLY_ANSWERED, greeted(init_f32)),
    ]
    return [raw_case(f"{rpc.COMMANDS[cmd].lower()} (extra): {name}", expect, fn, cmd)
            for cmd, name, expect, fn in table]


# ---------------------------------------------------------------------------------------------
# raw messages: each gets a connection of its own and returns an outcome


def expect_closed(c) -> str:
    """After a hostile message: the server closes the connection (we close our side first, so
    a server still waiting for the rest of a message sees its end)."""
    try:
        c.sock.shutdown(socket.SHUT_WR)
    except OSError:
        return REFUSED  # already closed by the server
    return REFUSED if c.closed_by_server(CASE_TIMEOUT) else "left open"


def hello(c):
    c.call(rpc.HELLO, bytes(rpc.CONN_CAPS_SIZE), 4 + rpc.CONN_CAPS_SIZE)


def graph_bytes(rng) -> bytes:
    """A valid GRAPH_COMPUTE payload of a spark_ffn_up node (its tensors are not placed:
    ids and addresses only), for truncations."""
    spec = good_up(rng)
    tensors = [rpc.Tensor(TYPES["F32"], ne4(t.ne), strides(t)) for t in spec.srcs]
    node = rpc.Tensor(TYPES["F32"], ne4(spec.dst.ne), strides(spec.dst), op=OPS["CUSTOM"],
                      op_params=rpc.custom_op_params(rpc.fnv1a64(spec.op), spec.params,
                                                     fmt=spec.params_format),
                      flags=rpc.FLAG_COMPUTE, src=tensors)
    return rpc.graph_payload([node])


def sends(*messages, greet: bool = True):
    """A raw case: HELLO (unless not `greet`), then each message, a (command, payload) pair or
    raw bytes (a callable makes them from the connection); the server must close."""
    def go(c):
        if greet:
            hello(c)
        for m in messages:
            m = m(c) if callable(m) else m
            if isinstance(m, bytes):
                c.send_raw(m)
            else:
                c.send(*m)
        return expect_closed(c)
    return go


def in_buffer(offset_from_end: int | None, size: int):
    """A 4-element f32 tensor in a new 4096-byte buffer of the connection (at its start, or
    `offset_from_end` bytes before its end) and `size` bytes of data for it: SET_TENSOR."""
    def message(c):
        remote, n = c.alloc_buffer(4096)
        base = c.buffer_base(remote)
        t = rpc.Tensor(TYPES["F32"], (4, 1, 1, 1), (4, 16, 16, 16), buffer=remote,
                       data=base if offset_from_end is None else base + n - offset_from_end)
        return rpc.SET_TENSOR, t.pack() + struct.pack("<BQ", 0, 0) + bytes(size)
    return message



def raw_cases() -> list[Case]:
    graph = graph_bytes(np.random.default_rng(SEED))
    no_such_node = graph[:8] + struct.pack("<Q", 0xFEEDFACE) + graph[16:]

    def get_past_end(c):
        remote, size = c.alloc_buffer(4096)
        t = rpc.Tensor(TYPES["F32"], (4, 1, 1, 1), (4, 16, 16, 16), buffer=remote,
                       data=c.buffer_base(remote))
        return rpc.GET_TENSOR, t.pack() + struct.pack("<QQ", 0, size + 4096)

    def alloc_huge(c):
        hello(c)
        remote, size = c.alloc_buffer(1 << 62)
        c.alignment()  # the connection still serves
        return REFUSED if (remote, size) == (0, 0) else f"allocated {size} bytes"

    def stock_node_without_data(c):
        hello(c)
        f32 = lambda: rpc.Tensor(TYPES["F32"], (4, 1, 1, 1), (4, 16, 16, 16))  # noqa: E731
        c.graph_compute([rpc.Tensor(TYPES["F32"], (4, 1, 1, 1), (4, 16, 16, 16), op=OPS["ADD"],
                                    src=[f32(), f32()], flags=rpc.FLAG_COMPUTE)])
        return expect_closed(c)

    def chain_of_sources(depth):
        def go(c):
            hello(c)
            prev = None
            for i in range(depth):  # tensors without op (not computed), each the next's source
                prev = rpc.Tensor(TYPES["F32"], (1, 1, 1, 1), (4, 4, 4, 4),
                                  src=[prev] if prev else [], id=i + 1)
            c.graph_compute([prev])
            c.alignment()
            return RAN
        return go

    def garbage(seed):
        rng = np.random.default_rng(seed)
        return bytes([int(rng.integers(0, rpc.CMD_COUNT + 8))]) \
            + rng.integers(0, 256, 300, dtype=np.uint8).tobytes()

    header = lambda cmd, size: struct.pack("<BQ", cmd, size)  # noqa: E731
    G = rpc.GRAPH_COMPUTE
    table = [  # (command, name, expected outcomes, the case)
        (rpc.HELLO, "first command not HELLO", ONLY_REFUSED,
         sends((rpc.DEVICE_COUNT, b""), greet=False)),
        (rpc.HELLO, "HELLO of the wrong size", ONLY_REFUSED,
         sends((rpc.HELLO, bytes(rpc.CONN_CAPS_SIZE - 1)), greet=False)),
        (200, "unknown command 200", ONLY_REFUSED, sends((200, b""))),
        (G, "a message shorter than its size field", ONLY_REFUSED,
         sends(header(G, 1 << 20) + bytes(100))),
        (rpc.ALLOC_BUFFER, "a fixed-size request one byte long", ONLY_REFUSED,
         sends((rpc.ALLOC_BUFFER, struct.pack("<IQB", 0, 64, 0)))),
        (G, "graph: header cut", ONLY_REFUSED, sends((G, struct.pack("<I", 0)))),
        (G, "graph: n_nodes 2^32 - 1", ONLY_REFUSED,
         sends((G, struct.pack("<II", 0, 2**32 - 1) + bytes(64)))),
        (G, "graph: n_tensors 2^32 - 1", ONLY_REFUSED,
         sends((G, struct.pack("<IIQI", 0, 1, 1, 2**32 - 1) + bytes(64)))),
        (G, "graph: device 7", ONLY_REFUSED, sends((G, struct.pack("<III", 7, 0, 0)))),
        (G, "graph: a node id not in the tensors", ONLY_REFUSED, sends((G, no_such_node))),
        (rpc.SET_TENSOR, "set_tensor: shorter than its header", ONLY_REFUSED,
         sends((rpc.SET_TENSOR, bytes(100)))),
        (rpc.SET_TENSOR, "set_tensor: data past the buffer", ONLY_REFUSED,
         sends(in_buffer(16, 64))),
        # inside the buffer, past the tensor's 16 bytes
        (rpc.SET_TENSOR, "set_tensor: more data than the tensor", ONLY_REFUSED,
         sends(in_buffer(None, 64))),
        (rpc.GET_TENSOR, "get_tensor: past the buffer", ONLY_REFUSED, sends(get_past_end)),
        (rpc.FREE_BUFFER, "free_buffer: unknown buffer", ONLY_REFUSED,
         sends((rpc.FREE_BUFFER, struct.pack("<Q", 0xDEAD0000)))),
        (rpc.ALLOC_BUFFER, "alloc_buffer: 2^62 bytes", ONLY_REFUSED, alloc_huge),
        (rpc.GRAPH_RECOMPUTE, "graph_recompute before any graph", ONLY_REFUSED,
         sends((rpc.GRAPH_RECOMPUTE, struct.pack("<I", 0)))),
        (G, "message size 2^62", ONLY_REFUSED, sends(header(G, 1 << 62))),
        (G, "message size 2^64 - 1", ONLY_REFUSED, sends(header(G, 2**64 - 1))),
        (G, "graph: a chain of 1 000 sources", frozenset({RAN}), chain_of_sources(1000)),
    ]
    table += [(G, f"graph: cut to {cut} bytes", ONLY_REFUSED,
               sends((G, graph[:cut if cut > 0 else len(graph) + cut])))
              for cut in (12, 100, 400, -300, -1)]
    table += [(garbage(SEED * 100 + i)[0], f"garbage after HELLO #{i}", ONLY_REFUSED,
               sends(garbage(SEED * 100 + i))) for i in range(6)]
    table += [
        # (patch 0017: create_node keeps a stack of its own; a stock node without data is refused)
        (G, "graph: a chain of 100 000 sources", frozenset({RAN}), chain_of_sources(100_000)),
        (G, "graph: a stock node on sources without data", ONLY_REFUSED, stock_node_without_data),
    ]
    return [raw_case(name, expect, fn, command) for command, name, expect, fn in table]

def written_cases(extra: bool) -> list[Case]:
    """Every case but the mutations; `extra`: with patch 0013's extra buffer cases (the server
    offers CPU_REPACK)."""
    return (cases() + checked_cases() + alias_cases() + graph_cases() + command_cases()
            + recompute_cases() + (extra_cases() if extra else []))


def mutations(rng: np.random.Generator, n: int) -> list[Case]:
    """Seeded random mutations of good Spark nodes (f32 and quantized): one to three fields of
    its tensors (sources or dst) or parameters set to hostile values: ne, nb, type (with the
    old strides, or "retype": the new type's own), place, NaN/inf values ("poison": an f32
    element or a block's f16 scale), "alias" (the bytes of another of its tensors). Pass:
    anything but a crash, a hang, a write outside dst or a read outside the inputs (ran and
    NaN without a line included: a supported weight type of random bytes can hold NaN)."""
    choices = {
        "ne": [0, 1, 2, 7, 2**31 + 1, 2**32 - 1],
        "nb": [0, 1, 2, 3, 5, 2**31, 2**32 - 1],
        "type": ["F16", "BF16", "Q8_0", "Q4_0", "I32", TYPES["COUNT"], 4, TYPES["MXFP4"],
                 TYPES["Q4_K"], TYPES["IQ2_XXS"]],
        "place": ["misaligned", "nodata", "foreign", "past_end"],
        "retype": ["F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "IQ2_XXS", "MXFP4", "F32"],
        "poison": [float("nan"), float("inf"), float("-inf"), 3e38, -65504.0],
        "int param": [0, -1, 2**31 - 1, -(2**31)],
        "softcap": [float("nan"), float("-inf"), 1e30, -1.0],
    }
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    out = []
    for i in range(n):
        op = pick(list(GOOD))
        seed = int(rng.integers(1 << 30))
        spec = GOOD[op](np.random.default_rng(seed))
        changes = []
        for _ in range(1 + int(rng.integers(3)) if rng.random() < 0.5 else 1):
            field_ = pick(["ne", "nb", "type", "retype", "place", "params", "poison", "alias"])
            dim = int(rng.integers(4)) if field_ in ("ne", "nb", "params") else None
            if field_ == "params":
                value = pick(choices["softcap" if dim == 3 else "int param"])
            elif field_ == "alias":
                value = int(rng.integers(4))  # which other tensor (target() picks the same way)
            elif field_ == "poison":
                value = (int(rng.integers(1 << 16)), pick(choices["poison"]))
            else:
                value = pick(choices[field_])
            changes.append((field_, dim, value, target(spec, int(rng.integers(5)))))
        label = ", ".join(
            f"{'params' if f == 'params' else 'dst' if t == 'dst' else f'src {t}'} "
            f"{f}{'' if d is None else f'[{d}]'} = {v}" for f, d, v, t in changes)
        out.append(Case(f"mutation {i}: {op} {label}", ANY_SAFE, node=mutate(op, seed, changes)))
    return out


def target(spec: Node, slot: int):
    """Which tensor of `spec` a mutation changes: source `slot` modulo its sources that are not
    nodes, or dst (slot 4, or no such source)."""
    plain = [i for i, s in enumerate(spec.srcs) if isinstance(s, TS)]
    return "dst" if slot == 4 or not plain else plain[slot % len(plain)]


def mutate(op, seed, changes):
    def build(_rng):
        spec = GOOD[op](np.random.default_rng(seed))
        for field_, dim, value, src in changes:
            if field_ == "params":
                params = list(spec.params)
                params[dim] = value
                spec = change(spec, params=tuple(params))
                continue
            cur = spec.dst if src == "dst" else spec.srcs[src]
            if field_ == "ne":
                ne = list(ne4(cur.ne))
                ne[dim] = value
                spec = change(spec, src=src, ne=tuple(ne), nb=None)
            elif field_ == "nb":
                nb = list(strides(cur))
                nb[dim] = value
                spec = change(spec, src=src, nb=tuple(nb))
            elif field_ == "type":
                spec = change(spec, src=src, type=value, nb=strides(cur))
            elif field_ == "retype":
                spec = change(spec, src=src, type=value, nb=None)
            elif field_ == "poison":
                spec = change(spec, src=src, values=cur.values, poison=cur.poison + (value,))
            elif field_ == "alias":
                other = target(spec, value)
                other = spec.dst if other == "dst" else spec.srcs[other]
                if other is not cur and isinstance(other, TS):
                    spec = change(spec, src=src, alias=other, values=None)
            else:
                spec = change(spec, src=src, place=value)
        return spec
    return build

