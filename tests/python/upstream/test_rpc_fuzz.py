"""Hostile RPC clients against an rpc-server with the Spark plugin (issue 36, item 3).

ggml's RPC protocol has no authentication: a server runs whatever graph a client sends it, and
with the plugin (patch 0009) that includes Spark nodes. This test speaks the protocol itself
(rpc_client.py) and sends a fixed set of hostile messages: Spark nodes whose sources have wrong
shapes, types and strides, views past their buffers, k = 0, r >= D, huge ne (and ne and nb whose
byte size wraps around 2^64), no or foreign parameters, unknown op ids, truncated and garbage
messages; then N_MUTATIONS random mutations (seed SEED) of one to three fields of good Spark
nodes.

Each case ends in one of:
- refused: ggml-rpc refused the message (the server closed the connection, or answered an
  error: a buffer of 0 bytes);
- nan: the Spark op refused its arguments as the op protocol says (docs/INTERFACES.md, "How
  every Spark op enters and fails"): its output is NaN (a dst that is not f32, or whose ne and
  nb reach past the address space, is left as it was) and the server printed one line
  `spark-backend: <op>: layer <L>: <reason>; output set to NaN` whose reason is the case's
  fault;
- ran: the graph ran and gave finite output (a legal corner: k >= F means dense; ggml skips a
  node with no element);
- upstream-abort: the server died on an assert in upstream code (ggml-rpc.cpp, ggml) listed in
  KNOWN_UPSTREAM_ABORTS; upstream-crash: it died of SIGSEGV in upstream code where the case
  expects it (KNOWN_UPSTREAM_CRASHES). Both are in patches/README.md, "Known limits"; the server
  is started again.
Anything else fails the test: a server that dies any other way (a signal, an assert or an abort
in Spark code, an AddressSanitizer report), a case that hangs, a NaN case without its line or
with another reason, a case whose outcome is not one its expectation allows (a known abort that
upstream fixed included). Mutations may end in any outcome but a crash or a hang. After every
case the server must be running and give a new client the right results (a stock ADD, both
FFN paths and the attention op, against numpy), and at the end the shipped model's greedy text
through `--rpc` must be the local one (test_rpc.py's check). The counts and every case's outcome
are written to tests/out/rpc-fuzz.txt.

The plugin prints at most 8 op failure lines per process; the server is started again before
that budget runs out, so every written NaN case's line is checked.

AddressSanitizer: `bash tools/asan-rpc.sh` builds ggml, rpc-server and (with a nightly Rust) the
plugin with ASan and runs this test against that server (SPARK_FUZZ_RPC_SERVER and
SPARK_FUZZ_PLUGIN name them; the test's client tools stay the installed ones); CI runs it
against the normal build."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from upstream_helpers import OUT_DIR, UPSTREAM, exit_status, llama_completion, tail, tool


def _sibling(name: str, path: str):
    """A module of this directory by file (pytest imports with importlib: no sys.path entry)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


rpc = _sibling("spark_rpc_client", "rpc_client.py")
test_rpc = _sibling("spark_test_rpc", "test_rpc.py")

# The seed of the cases' data and mutations, and how many mutations: CI's are fixed; a longer
# search is SPARK_FUZZ_SEED=7 SPARK_FUZZ_MUTATIONS=2000 (2120 cases in ~100 s on 2 cores).
SEED = int(os.environ.get("SPARK_FUZZ_SEED", "36"))
N_MUTATIONS = int(os.environ.get("SPARK_FUZZ_MUTATIONS", "200"))
CASE_TIMEOUT = 10.0  # seconds a case may take before it counts as a hang
LINE_BUDGET = 8  # op failure lines the plugin prints per process (op::MAX_ERROR_LINES)
SENTINEL = -12345.0  # what dst holds before a case (f32)
OP_LINE = re.compile(
    r"^spark-backend: (\S+): layer (\S+): (.*); output (?:set to NaN|not written)$", re.M)

# Server aborts in upstream code (ggml-rpc.cpp, ggml) that a client can cause; each is also a
# bullet of patches/README.md, "Known limits". id: what the server's log shows.
KNOWN_UPSTREAM_ABORTS = {
    # rpc_server::deserialize_tensor asserts that a tensor lies inside its buffer instead of
    # refusing it: any message with a tensor past (or before) its buffer ends the server.
    "rpc-tensor-outside-buffer": re.compile(
        r"ggml-rpc\.cpp:\d+: GGML_ASSERT\(tensor->data >= buffer_start && "
        r"tensor->data \+ tensor_size <= buffer_start \+ buffer_size\) failed"),
    # ... and ggml_new_tensor_4d, which it calls first, asserts that the element count fits
    # int64_t
    "ggml-tensor-too-many-elements": re.compile(
        r"ggml\.c:\d+: GGML_ASSERT\(INT64_MAX / ne\[i\] > current_nelements\) failed"),
    # rpc_server::set_tensor checks the data against the buffer, then ggml_backend_tensor_set
    # asserts it against the tensor: more data than the tensor's size ends the server
    "rpc-set-tensor-past-tensor": re.compile(
        r"ggml-backend\.cpp:\d+: GGML_ASSERT\(offset \+ size <= ggml_nbytes\(tensor\) && "
        r"\"tensor write out of bounds\"\) failed"),
    # recv_msg catches std::bad_alloc from vector::resize, not the std::length_error of a size
    # above PTRDIFF_MAX: the exception ends the process.
    "rpc-message-size-length-error": re.compile(
        r"terminate called after throwing an instance of 'std::length_error'"),
}

# Server crashes (SIGSEGV) in upstream code that a client can cause, by case (patches/README.md,
# "Known limits"): id -> what an AddressSanitizer build reports (tools/asan-rpc.sh).
KNOWN_UPSTREAM_CRASHES = {
    # rpc_server::create_node accepts a tensor with neither buffer nor data (data NULL), and
    # ggml-cpu computes a stock node on it
    "cpu-op-on-null-data": re.compile(r"AddressSanitizer: SEGV on unknown address (?:0x)?0{6,}"),
    # rpc_server::create_node recurses once per source: a chain of 100 000 tensors overflows the
    # server's stack
    "rpc-create-node-recursion": re.compile(
        r"AddressSanitizer: stack-overflow(?s:.*?)rpc_server::create_node"),
}

ASAN_NEW_OOM = re.compile(
    r"ERROR: AddressSanitizer: allocator is out of memory(?s:.*?) in operator new(?s:.*?) in "
    r"recv_msg ")

# ---------------------------------------------------------------------------------------------
# ggml's numbers, from the installed header


# (empty when tools/upstream.sh has not run: the test then fails saying so, collection does not)
GGML_H = UPSTREAM / "include" / "ggml.h"
TYPES, OPS, LIMITS = rpc.ggml_header_constants(GGML_H) if GGML_H.is_file() else ({}, {}, {})

# ---------------------------------------------------------------------------------------------
# graphs as specs: what the client sends, before it is placed in a server buffer

# The FFN: D model width, R = r_f, W = D - R the width of K2, F neurons, T tokens, P chunks.
D, R, F, T, P = 64, 16, 32, 3, 4
W = D - R
# Attention: head width, query heads, KV heads, tokens, streams, cache positions, r_a, k_a.
AH, AN, AKV, AT, AS, ANKV, AR, AK = 8, 2, 1, 2, 1, 4, 4, 4


@dataclass
class TS:
    """A tensor of a case: type, ne, strides (None: contiguous), values (None: random), and where
    it lies: "arena" (in the case's buffer), "nodata" (no buffer, data 0), "foreign" (a buffer
    id the server never gave, data non-zero), "past_end" (starts 16 bytes before its buffer's
    end), "before_start" (64 bytes before its buffer), "misaligned" (2 bytes past an aligned
    offset)."""
    type: str = "F32"
    ne: tuple = (1,)
    nb: tuple | None = None
    values: object = None
    place: str = "arena"


@dataclass
class Node:
    """A custom node: its op's name, sources (TS, Node or None), dst, Spark parameters (layer,
    k, r, softcap[, ffn_cutoff, ffn_z]; None: no parameter block) and the fields a hostile
    client may change."""
    op: str
    srcs: list
    dst: TS
    params: tuple | None = (0, F, 0, 0.0)
    magic: bytes = b"SPK1"
    call_state: bytes = bytes(8)
    op_id: int | None = None  # None: the FNV-1a id of `op`
    ggml_op: str = "CUSTOM"
    n_tasks: int = rpc.N_TASKS_MAX


def ne4(ne) -> tuple:
    return tuple(ne) + (1,) * (4 - len(ne))


TYPE_NAMES = {v: k for k, v in TYPES.items()}


def elem(type_name) -> tuple[int, int]:
    """(bytes, elements) of a block of a type given by name or id (an id ggml has no such
    table entry for, e.g. GGML_TYPE_COUNT: 1 byte)."""
    name = TYPE_NAMES.get(type_name, type_name) if isinstance(type_name, int) else type_name
    return rpc.TYPE_SIZE.get(name, (1, 1))


def strides(t: TS) -> tuple:
    """nb as it travels (u32: the client's serialize_tensor cuts larger strides)."""
    e, b = elem(t.type)
    nb = tuple(t.nb) if t.nb is not None else rpc.contiguous_nb(e, b, ne4(t.ne))
    return tuple(x & 0xFFFFFFFF for x in nb)


def ggml_nbytes(t: TS) -> int:
    """ggml_nbytes() of the tensor as the server computes it (size_t arithmetic: it wraps)."""
    ne, nb = ne4(t.ne), strides(t)
    if min(ne) <= 0:
        return 0
    e, b = elem(t.type)
    n = e if b == 1 else ne[0] * nb[0] // b
    for i in range(0 if b == 1 else 1, 4):
        n += (ne[i] - 1) * nb[i]
    return n % 2**64


def rand_values(rng, t: TS) -> np.ndarray:
    return (rng.standard_normal(int(np.prod(ne4(t.ne)))) * 0.5).astype(np.float32)


def good_up(rng, k=F):
    s = TS("F32", (F, T), values=rand_values(rng, TS(ne=(F, T))))
    h = TS("F32", (D, T), values=rand_values(rng, TS(ne=(D, T))))
    k2 = TS("F32", (W, F), values=rand_values(rng, TS(ne=(W, F))))
    return Node("spark_ffn_up", [s, h, k2], TS("F32", (T, F)), (0, k, 0, 0.0))


def good_down(rng, up=None):
    up = up or good_up(rng)
    v = TS("F32", (D, F), values=rand_values(rng, TS(ne=(D, F))))
    return Node("spark_ffn_down", [up, v], TS("F32", (D, T)), (0, F, 0, 0.0))


def good_fused(rng, k=F):
    up = good_up(rng, k)
    v = TS("F32", (D, F), values=rand_values(rng, TS(ne=(D, F))))
    return Node("spark_ffn_fused", [*up.srcs, v], TS("F32", (D, T, P)), (1, k, 0, 0.0))


def good_sum(rng):
    return Node("spark_ffn_sum", [good_fused(rng)], TS("F32", (D, T)), (1, F, 0, 0.0))


def good_attn(rng, k=AK):
    q = TS("F32", (AH, AN, AT, AS), values=rand_values(rng, TS(ne=(AH, AN, AT, AS))))
    kc = TS("F32", (AH, AKV, ANKV, AS), values=rand_values(rng, TS(ne=(AH, AKV, ANKV, AS))))
    vc = TS("F32", (AH, AKV, ANKV, AS), values=rand_values(rng, TS(ne=(AH, AKV, ANKV, AS))))
    mask = TS("F32", (ANKV, AT, 1, AS), values=np.zeros(ANKV * AT * AS, np.float32))
    return Node("spark_attn", [q, kc, vc, mask], TS("F32", (AH, AN, AT, AS)), (2, k, AR, 0.0))


GOOD = {"spark_ffn_up": good_up, "spark_ffn_down": good_down, "spark_ffn_fused": good_fused,
        "spark_ffn_sum": good_sum, "spark_attn": good_attn}


# numpy references (SPEC 4; docs/INTERFACES.md: k >= F keeps every neuron, unshifted; k_a >=
# the valid positions keeps every position)


def arr(t: TS, shape) -> np.ndarray:
    """A spec's values as numpy, in ggml's order reversed (ne0 fastest -> last axis)."""
    return np.asarray(t.values, np.float64).reshape(shape)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def ffn_u(up: Node) -> np.ndarray:
    """u [F, T] (the op's dst u [T, F] read as numpy) of a dense spark_ffn_up."""
    s, h, k2 = arr(up.srcs[0], (T, F)), arr(up.srcs[1], (T, D)), arr(up.srcs[2], (F, W))
    return (gelu_tanh(s) * (h[:, D - W:] @ k2.T)).T


def ffn_partials(fused: Node) -> np.ndarray:
    s, h, k2 = arr(fused.srcs[0], (T, F)), arr(fused.srcs[1], (T, D)), arr(fused.srcs[2], (F, W))
    v = arr(fused.srcs[3], (F, D))
    u = gelu_tanh(s) * (h[:, D - W:] @ k2.T)  # [T, F]
    return np.stack([u[:, c * F // P:(c + 1) * F // P] @ v[c * F // P:(c + 1) * F // P]
                     for c in range(P)])  # [P, T, D]


def attn_ref(node: Node) -> np.ndarray:
    q = arr(node.srcs[0], (AS, AT, AN, AH))
    k = arr(node.srcs[1], (AS, ANKV, AKV, AH))
    v = arr(node.srcs[2], (AS, ANKV, AKV, AH))
    out = np.zeros((AS, AT, AN, AH))
    for s in range(AS):
        for t in range(AT):
            for n in range(AN):
                g = n // (AN // AKV)
                s1 = k[s, :, g, :AR] @ q[s, t, n, :AR]
                p = np.exp(s1 - s1.max())
                w = p / p.sum() * np.log1p(np.exp(k[s, :, g, AR:] @ q[s, t, n, AR:]))
                out[s, t, n] = w @ v[s, :, g]
    return out


# ---------------------------------------------------------------------------------------------
# placing specs in a server buffer


class Placed:
    """The tensors of one case in one server buffer (an rpc.Arena of the case's connection)."""

    ARENA_BYTES = 4 << 20

    def __init__(self, client, rng):
        self.client = client
        self.rng = rng
        self.arena = rpc.Arena(client, self.ARENA_BYTES, TYPES)
        self.made: dict[int, rpc.Tensor] = {}
        self.regions: dict[int, tuple[int, int]] = {}  # id(spec) -> (address, bytes) in arena

    def reserve(self, nbytes: int, misalign: int = 0) -> int:
        a = self.arena
        off = -(-a.used // a.align) * a.align + misalign
        a.used = off + nbytes
        return a.base + off

    def tensor(self, t: TS, fill: bytes | None = None) -> rpc.Tensor:
        """The tensor of spec `t`, placed as it says and written with its values (random ones
        when it has none) or with `fill` repeated."""
        key = id(t)
        if key in self.made:
            return self.made[key]
        ne, nb, nbytes = ne4(t.ne), strides(t), ggml_nbytes(t)
        a = self.arena
        buffer, data = a.remote, 0
        if t.place == "nodata":
            buffer = 0
        elif t.place == "foreign":
            buffer, data = 0xDEAD0000, 0x10000
        elif t.place == "past_end":
            data = a.base + a.size - 16
        elif t.place == "before_start":
            data = a.base - 64
        elif nbytes > a.size - a.used - 64:
            data = a.base + a.used  # does not fit: the server sees a tensor past its buffer
        else:
            data = self.reserve(nbytes, 2 if t.place == "misaligned" else 0)
            self.regions[key] = (data, nbytes)
        out = rpc.Tensor(TYPES[t.type] if isinstance(t.type, str) else t.type, ne, nb,
                         buffer=buffer, data=data)
        if key in self.regions and nbytes:
            payload = None if fill is None else (fill * (nbytes // len(fill) + 1))[:nbytes]
            if payload is None:
                values = t.values
                if values is None and t.type == "F32":
                    values = (self.rng.standard_normal(nbytes // 4) * 0.5).astype(np.float32)
                if isinstance(values, np.ndarray):
                    payload = values.astype("<f4").tobytes()
                elif values is not None:
                    payload = bytes(values)
                else:
                    payload = self.rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
            self.client.set_tensor(out, payload[:nbytes].ljust(nbytes, b"\0"))
        self.made[key] = out
        return out

    def node(self, n: Node) -> rpc.Tensor:
        key = id(n)
        if key in self.made:
            return self.made[key]
        srcs = [None if s is None else self.node(s) if isinstance(s, Node) else self.tensor(s)
                for s in n.srcs]
        fill = struct.pack("<f", SENTINEL) if n.dst.type == "F32" else b"\xa5"
        dst = self.tensor(n.dst, fill)
        op_id = rpc.fnv1a64(n.op) if n.op_id is None else n.op_id
        params = rpc.custom_op_params(op_id, n.params, n.n_tasks, n.magic, n.call_state)
        if n.params is None:
            params = params[:24]
        node = dataclasses.replace(dst, op=OPS[n.ggml_op], op_params=params,
                                   flags=rpc.FLAG_COMPUTE, src=[s or 0 for s in srcs],
                                   name=n.op)
        self.made[key] = node
        self.regions[key] = self.regions.get(id(n.dst), (0, 0))
        return node

    def read(self, spec) -> bytes | None:
        """The bytes of a spec's region (None: it has none in the arena)."""
        addr, nbytes = self.regions.get(id(spec), (0, 0))
        if not addr:
            return None
        if nbytes == 0:
            return b""
        reader = rpc.Tensor(TYPES["I8"], (nbytes, 1, 1, 1), (1, nbytes, nbytes, nbytes),
                            buffer=self.arena.remote, data=addr)
        return self.client.get_tensor(reader, nbytes)


# ---------------------------------------------------------------------------------------------
# cases


@dataclass
class Case:
    """A hostile case. `node(rng)` gives a Spark node to send (a graph of it); `raw(endpoint)`
    instead speaks to the server itself and returns an outcome. `expect`: the outcomes that
    pass; `why`: what the op's line must say (a regex) when the outcome is nan."""
    name: str
    expect: frozenset
    node: object = None
    raw: object = None
    why: str | None = None
    upstream_crash: str | None = None  # a KNOWN_UPSTREAM_CRASHES id this case is expected to hit


REFUSED, NAN, RAN, ABORT, CRASH = "refused", "nan", "ran", "upstream-abort", "upstream-crash"
PARTLY_NAN, UNTOUCHED = "partly nan", "untouched"
ONLY_NAN, ONLY_REFUSED, ONLY_ABORT = frozenset({NAN}), frozenset({REFUSED}), frozenset({ABORT})
ANY_SAFE = frozenset({REFUSED, NAN, PARTLY_NAN, RAN, ABORT})


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


def raw_case(name, expect, fn, upstream_crash=None):
    return Case(name, expect, raw=fn, upstream_crash=upstream_crash)


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
        # rows closer than a row: op::enter's overlap check refuses them before the op's own
        nan_case("up: h row stride below its row", "spark_ffn_up", r"args\[1\]: .*overlap",
                 src=1, nb=(4, 4 * D - 4, (4 * D - 4) * T, (4 * D - 4) * T)),
        nan_case("up: scores rows padded", "spark_ffn_up", r"scores rows must be contiguous",
                 src=0, nb=(4, 4 * F + 16, (4 * F + 16) * T, (4 * F + 16) * T)),
        nan_case("up: K2 nb0 not its element", "spark_ffn_up", r"ffn_up: not a packed 2-D",
                 src=2, nb=(8, 8 * W, 8 * W * F, 8 * W * F)),
        nan_case("up: K2 rows overlap", "spark_ffn_up", r"args\[2\]: .*elements overlap",
                 src=2, nb=(4, 4 * W - 4, (4 * W - 4) * F, (4 * W - 4) * F)),
        nan_case("up: K2 q8_0, a row not whole blocks", "spark_ffn_up",
                 r"ffn_up: \d+ columns are not whole q8_0 blocks", src=2, type="Q8_0",
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
        nan_case("up: K2 without data", "spark_ffn_up", r"args\[2\]: .*tensor has no data",
                 src=2, place="nodata"),
        nan_case("up: dst without data", "spark_ffn_up", r"tensor has no data",
                 src="dst", place="nodata"),
        op_case("up: no token (T = 0)", "spark_ffn_up", frozenset({RAN, NAN}),
                srcs=[TS("F32", (F, 0)), TS("F32", (D, 0)), TS("F32", (W, F))],
                dst=TS("F32", (0, F))),
        op_case("up: no neuron (F = 0)", "spark_ffn_up", frozenset({RAN, NAN}),
                srcs=[TS("F32", (0, T)), TS("F32", (D, T)), TS("F32", (W, 0))],
                dst=TS("F32", (T, 0))),
        # bytes 24-31 are the call's counters, zero at rest (docs/INTERFACES.md); a client that
        # sends others gets its own output unwritten: the op cannot tell them from a late thread
        op_case("up: a call state left non-zero", "spark_ffn_up", frozenset({NAN, RAN, UNTOUCHED}),
                call_state=struct.pack("<II", 1000, 1)),
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
        nan_case("attn: k q8_0", "spark_attn", r"k: unsupported type q8_0", src=1,
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
        nan_case("attn: mask without data", "spark_attn", r"mask: .*tensor has no data", src=3,
                 place="nodata"),
        op_case("attn: no cache position (n_kv = 0)", "spark_attn", frozenset({RAN, NAN}),
                srcs=[TS("F32", (AH, AN, AT, AS)), TS("F32", (AH, AKV, 0, AS)),
                      TS("F32", (AH, AKV, 0, AS)), TS("F32", (0, AT, 1, AS))]),
        Case("attn: ne and nb whose size wraps 2^64", ONLY_NAN, node=overflowing_attn,
             why=r"more than the address space"),
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
        # what ggml-rpc refuses or dies on before a Spark op runs
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
        op_case("a view past its buffer", "spark_ffn_up", ONLY_ABORT, src=2, place="past_end"),
        op_case("a view before its buffer", "spark_ffn_up", ONLY_ABORT, src=1,
                place="before_start"),
        op_case("huge ne in a buffer (more than int64 elements)", "spark_ffn_up", ONLY_ABORT,
                src=0, ne=(huge, huge), nb=(4, 2**32 - 4, 2**32 - 4, 2**32 - 4)),
        op_case("huge ne in a buffer", "spark_ffn_up", ONLY_ABORT, src=1, ne=(D, huge),
                nb=(4, 4 * D, 4 * D * huge, 4 * D * huge)),
        op_case("dst past its buffer", "spark_ffn_sum", ONLY_ABORT, src="dst",
                place="past_end"),
    ]
    out += raw_cases()
    return out


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
                      op_params=rpc.custom_op_params(rpc.fnv1a64(spec.op), spec.params),
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
        c.alignment()
        return RAN

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
    table = [
        ("first command not HELLO", ONLY_REFUSED,
         sends((rpc.DEVICE_COUNT, b""), greet=False)),
        ("HELLO of the wrong size", ONLY_REFUSED,
         sends((rpc.HELLO, bytes(rpc.CONN_CAPS_SIZE - 1)), greet=False)),
        ("unknown command 200", ONLY_REFUSED, sends((200, b""))),
        ("a message shorter than its size field", ONLY_REFUSED,
         sends(header(G, 1 << 20) + bytes(100))),
        ("a fixed-size request one byte long", ONLY_REFUSED,
         sends((rpc.ALLOC_BUFFER, struct.pack("<IQB", 0, 64, 0)))),
        ("graph: header cut", ONLY_REFUSED, sends((G, struct.pack("<I", 0)))),
        ("graph: n_nodes 2^32 - 1", ONLY_REFUSED,
         sends((G, struct.pack("<II", 0, 2**32 - 1) + bytes(64)))),
        ("graph: n_tensors 2^32 - 1", ONLY_REFUSED,
         sends((G, struct.pack("<IIQI", 0, 1, 1, 2**32 - 1) + bytes(64)))),
        ("graph: device 7", ONLY_REFUSED, sends((G, struct.pack("<III", 7, 0, 0)))),
        ("graph: a node id not in the tensors", ONLY_REFUSED, sends((G, no_such_node))),
        ("set_tensor: shorter than its header", ONLY_REFUSED, sends((rpc.SET_TENSOR, bytes(100)))),
        ("set_tensor: data past the buffer", ONLY_REFUSED, sends(in_buffer(16, 64))),
        # inside the buffer, past the tensor's 16 bytes
        ("set_tensor: more data than the tensor", ONLY_ABORT, sends(in_buffer(None, 64))),
        ("get_tensor: past the buffer", ONLY_REFUSED, sends(get_past_end)),
        ("free_buffer: unknown buffer", ONLY_REFUSED,
         sends((rpc.FREE_BUFFER, struct.pack("<Q", 0xDEAD0000)))),
        ("alloc_buffer: 2^62 bytes", ONLY_REFUSED, alloc_huge),
        ("graph_recompute before any graph", ONLY_REFUSED,
         sends((rpc.GRAPH_RECOMPUTE, struct.pack("<I", 0)))),
        ("message size 2^62", ONLY_REFUSED, sends(header(G, 1 << 62))),
        ("message size 2^64 - 1", ONLY_ABORT, sends(header(G, 2**64 - 1))),
        ("graph: a chain of 1 000 sources", frozenset({RAN}), chain_of_sources(1000)),
    ]
    table += [(f"graph: cut to {cut} bytes", ONLY_REFUSED,
               sends((G, graph[:cut if cut > 0 else len(graph) + cut])))
              for cut in (12, 100, 400, -300, -1)]
    table += [(f"garbage after HELLO #{i}", frozenset({REFUSED, ABORT}),
               sends(garbage(SEED * 100 + i))) for i in range(6)]
    out = [raw_case(*row) for row in table]
    out += [
        raw_case("graph: a chain of 100 000 sources", frozenset({CRASH}),
                 chain_of_sources(100_000), upstream_crash="rpc-create-node-recursion"),
        raw_case("graph: a stock node on sources without data", frozenset({CRASH}),
                 stock_node_without_data, upstream_crash="cpu-op-on-null-data"),
    ]
    return out


def mutations(rng: np.random.Generator, n: int) -> list[Case]:
    """Seeded random mutations of good Spark nodes: one to three fields of its tensors (sources
    or dst) or parameters set to hostile values. Pass: anything but a crash or a hang (ran and
    NaN without a line included: a supported weight type of random bytes can hold NaN)."""
    choices = {
        "ne": [0, 1, 2, 7, 2**31 + 1, 2**32 - 1],
        "nb": [0, 1, 2, 3, 5, 2**31, 2**32 - 1],
        "type": ["F16", "BF16", "Q8_0", "Q4_0", "I32", TYPES["COUNT"], 4, TYPES["MXFP4"],
                 TYPES["Q4_K"], TYPES["IQ2_XXS"]],
        "place": ["misaligned", "nodata", "foreign", "past_end"],
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
            field_ = pick(["ne", "nb", "type", "place", "params"])
            dim = int(rng.integers(4)) if field_ in ("ne", "nb", "params") else None
            if field_ == "params":
                value = pick(choices["softcap" if dim == 3 else "int param"])
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
            else:
                spec = change(spec, src=src, place=value)
        return spec
    return build


# ---------------------------------------------------------------------------------------------
# the server and the good client


@dataclass
class Tally:
    rows: list = field(default_factory=list)  # (case, outcome, detail)
    aborts: dict = field(default_factory=dict)  # known id -> [case names]
    failures: list = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for _, o, _ in self.rows if o == outcome)


class Harness:
    """One rpc-server with the plugin at a time (started again after an abort, and before the
    plugin's line budget runs out), and the checks around each case."""

    def __init__(self, workdir: Path, binary: Path | None, plugin: Path | None):
        self.workdir = workdir
        self.binary = binary
        self.plugin = plugin
        self.starts = 0
        self.server = None
        self.logs: list[Path] = []
        self.start()

    def start(self):
        self.starts += 1
        with pytest.MonkeyPatch.context() as mp:
            if self.plugin:  # the server's plugin only (tool_env reads PLUGIN)
                mp.setattr(sys.modules["upstream_helpers"], "PLUGIN", self.plugin)
            self.server = test_rpc.start_rpc_server(self.workdir, True, binary=self.binary,
                                                    name=f"fuzz{self.starts}")
        self.logs.append(self.server.log_path)
        self.seen = 0

    def restart(self):
        self.server.stop()
        self.start()

    def log_since(self) -> str:
        text = self.server.log()
        new, self.seen = text[self.seen:], len(text)
        return new

    def op_lines(self) -> int:
        return len(OP_LINE.findall(self.server.log()))

    def dead_end(self, log: str, rc: int, case: Case) -> tuple[str, str]:
        """(outcome, detail) of a server that exited: a known upstream abort, the known upstream
        crash the case expects, else a crash."""
        known = case.upstream_crash
        if known and "AddressSanitizer" not in log and rc == -signal.SIGSEGV:
            return CRASH, f"{known}: SIGSEGV"
        if known and KNOWN_UPSTREAM_CRASHES[known].search(log):
            return CRASH, f"{known}: " + next(line for line in log.splitlines()
                                              if "AddressSanitizer" in line)
        if ASAN_NEW_OOM.search(log):
            # ASan's operator new reports and aborts where glibc's throws std::bad_alloc, which
            # recv_msg catches (the normal build refuses the message): not a fault of the server
            return REFUSED, "ASan build: operator new out of memory in recv_msg (glibc: bad_alloc)"
        if "AddressSanitizer" in log:
            return "crash", f"AddressSanitizer report (exit {exit_status(rc)})"
        for known, pattern in KNOWN_UPSTREAM_ABORTS.items():
            m = pattern.search(log)
            if m:
                return ABORT, f"{known}: {m.group(0)}"
        return "crash", f"server exited {exit_status(rc)}"

    def good_client(self, rng) -> str | None:
        """None when a new client gets the right results, else what went wrong."""
        try:
            with rpc.Client.connect(self.server.endpoint, CASE_TIMEOUT) as c:
                placed = Placed(c, rng)
                a = TS("F32", (16,), values=np.arange(16, dtype=np.float32))
                b = TS("F32", (16,), values=np.full(16, 0.5, np.float32))
                add_dst = placed.tensor(TS("F32", (16,)))
                add = dataclasses.replace(add_dst, op=OPS["ADD"], flags=rpc.FLAG_COMPUTE,
                                          src=[placed.tensor(a), placed.tensor(b)])
                down, fsum, attn = good_down(rng), good_sum(rng), good_attn(rng)
                nodes = [add, placed.node(down.srcs[0]), placed.node(down),
                         placed.node(fsum.srcs[0]), placed.node(fsum), placed.node(attn)]
                c.graph_compute(nodes)
                got = {
                    "add": np.frombuffer(c.get_tensor(add, 64), "<f4"),
                    "up": np.frombuffer(placed.read(down.srcs[0]), "<f4").reshape(F, T),
                    "down": np.frombuffer(placed.read(down), "<f4").reshape(T, D),
                    "fused": np.frombuffer(placed.read(fsum.srcs[0]), "<f4").reshape(P, T, D),
                    "sum": np.frombuffer(placed.read(fsum), "<f4").reshape(T, D),
                    "attn": np.frombuffer(placed.read(attn), "<f4").reshape(AS, AT, AN, AH),
                }
        except (rpc.Closed, OSError, RuntimeError) as e:
            return f"the good client failed: {e!r}"
        u = ffn_u(down.srcs[0])
        want = {"add": np.arange(16) + 0.5, "up": u,
                "down": u.T @ arr(down.srcs[1], (F, D)),
                "fused": ffn_partials(fsum.srcs[0]), "sum": ffn_partials(fsum.srcs[0]).sum(0),
                "attn": attn_ref(attn)}
        bad = [k for k in want if not np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5)]
        if bad:
            return "wrong results for " + ", ".join(
                f"{k} (max error {np.max(np.abs(got[k] - want[k])):.3g})" for k in bad)
        return None

    def settle(self, timeout: float = 5.0) -> int | None:
        """Waits until the server has closed every connection it accepted (its log has as many
        "Client connection closed" as "Accepted client connection" lines: it waits for the next
        client) or has exited; its exit status then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.server.proc.poll()
            if rc is not None:
                return rc
            log = self.server.log()
            if log.count("Accepted client connection") == log.count("Client connection closed"):
                return None
            time.sleep(0.005)
        return self.server.proc.poll()

    def run(self, case: Case, rng) -> tuple[str, str]:
        """Runs one case: (outcome, detail)."""
        if self.op_lines() > LINE_BUDGET - 3:
            self.restart()
        self.settle()
        self.log_since()
        spec = None
        try:
            if case.raw is not None:
                c = rpc.Client(self.server.endpoint, CASE_TIMEOUT)
                try:
                    outcome, detail = case.raw(c), ""
                finally:
                    c.close()
            else:
                with rpc.Client.connect(self.server.endpoint, CASE_TIMEOUT) as c:
                    placed = Placed(c, rng)
                    spec = case.node(rng)
                    c.graph_compute([placed.node(spec)])
                    out = placed.read(spec)
                    if out is None:
                        c.alignment()  # the graph was computed: the connection still serves
                    outcome, detail = classify(spec, out)
        except socket.timeout:
            outcome, detail = "hang", f"no answer in {CASE_TIMEOUT} s"
        except (rpc.Closed, ConnectionError) as e:
            outcome, detail = REFUSED, str(e)
        rc = self.settle() if outcome != "hang" else None
        log = self.log_since()
        if rc is not None:
            outcome, detail = self.dead_end(log, rc, case)
            detail += "\n" + tail(log, 15)
            self.start()
            return outcome, detail
        if outcome == "hang":
            self.server.proc.kill()
            self.server.proc.wait()
            self.start()
            return outcome, detail + "\n" + tail(log, 15)
        if spec is None:
            return outcome, detail
        lines = OP_LINE.findall(log)
        if lines and outcome in (RAN, UNTOUCHED) and detail in ("no output element",
                                                               "dst left as it was"):
            outcome = NAN  # the op refused a dst it had nothing (or no f32) to fill
        if lines and outcome == RAN:
            return "ran with a failure line", "\n".join(map(str, lines))
        if outcome == NAN and case.why:
            if len(lines) != 1 or lines[0][0] != spec.op:
                return "nan without its one line", "\n".join(map(str, lines)) or tail(log, 10)
            if not re.search(case.why, lines[0][2]):
                return "nan for another reason", f"{lines[0][2]!r} does not match {case.why!r}"
            detail = lines[0][2]
        elif lines:
            detail = (detail + " " if detail else "") + lines[0][2]
        return outcome, detail


def classify(spec: Node, out: bytes | None) -> tuple[str, str]:
    """The outcome of a node whose dst region read back as `out`: its elements (by dst's ne and
    nb; padding between them is not dst's) all NaN, some, none, or as they were."""
    if out is None or len(out) == 0:
        return RAN, "no output element"
    if spec.dst.type == "F32":
        ne, nb = ne4(spec.dst.ne), strides(spec.dst)
        if sum((n - 1) * b for n, b in zip(ne, nb)) + 4 > len(out) \
                or math.prod(ne) * 4 > len(out):
            # ne and nb reach past the bytes ggml_nbytes() gave it (a size that wrapped), or
            # its elements overlap (more of them than its bytes hold)
            if out == struct.pack("<f", SENTINEL) * (len(out) // 4) + out[len(out) // 4 * 4:]:
                return UNTOUCHED, "dst left as it was"
            return "written", f"dst ne {ne} nb {nb} reach past its {len(out)} bytes, changed"
        v = np.ndarray(ne[::-1], "<f4", buffer=out, strides=nb[::-1]).ravel()
        if np.isnan(v).all():
            return NAN, ""
        if np.isnan(v).any():
            return PARTLY_NAN, f"{np.isnan(v).sum()} of {v.size} values NaN"
        if (v == SENTINEL).all():
            return UNTOUCHED, "dst left as it was"
        return RAN, f"finite, max |x| {np.abs(v).max():.3g}"
    if out == b"\xa5" * len(out):
        return UNTOUCHED, "dst left as it was"
    return RAN, "dst (not f32) written"


# ---------------------------------------------------------------------------------------------
# the test


def fuzz_target(variable: str) -> Path | None:
    """SPARK_FUZZ_RPC_SERVER: another rpc-server to attack; SPARK_FUZZ_PLUGIN: another plugin
    for it (the client tools keep the installed one). tools/asan-rpc.sh sets both to its ASan
    builds."""
    path = os.environ.get(variable)
    if not path:
        return None
    if not Path(path).is_file():
        pytest.fail(f"{variable}={path} is not a file", pytrace=False)
    return Path(path)


def test_hostile_rpc_clients_get_refusals_or_nan_and_the_server_keeps_serving(
        shipped_f32, tmp_path, monkeypatch):
    tool("rpc-server")  # fails saying how to build the tools when they are missing
    assert (LIMITS["GGML_MAX_DIMS"], LIMITS["GGML_MAX_SRC"], LIMITS["GGML_MAX_OP_PARAMS"],
            LIMITS["GGML_MAX_NAME"]) == (4, 10, 64, 64), f"rpc_tensor's layout changed: {LIMITS}"
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")  # an abort's gdb backtrace takes seconds
    t0 = time.monotonic()
    rng = np.random.default_rng(SEED)
    all_cases = cases() + mutations(np.random.default_rng(SEED + 1), N_MUTATIONS)
    harness = Harness(tmp_path, fuzz_target("SPARK_FUZZ_RPC_SERVER"),
                      fuzz_target("SPARK_FUZZ_PLUGIN"))
    tally = Tally()
    try:
        version = None
        with rpc.Client.connect(harness.server.endpoint) as c:
            version = c.version
            missing = [op for op in GOOD if not c.custom_op_supported(op)]
        assert not missing, harness.server.explain(f"the server has not registered {missing}")
        problem = harness.good_client(rng)
        assert problem is None, harness.server.explain(f"before any case: {problem}")
        for case in all_cases:
            outcome, detail = harness.run(case, rng)
            tally.rows.append((case.name, outcome, detail))
            if outcome in (ABORT, CRASH):
                tally.aborts.setdefault(detail.split(":", 1)[0], []).append(case.name)
            if outcome not in case.expect:
                tally.failures.append(f"{case.name}: {outcome} (want one of "
                                      f"{sorted(case.expect)}): {detail}")
            problem = harness.good_client(rng)
            if problem is not None:
                tally.failures.append(f"after '{case.name}': {problem}")
                if harness.server.proc.poll() is not None:
                    harness.start()
        # the shipped model through --rpc gives the local text (test_rpc.py's check)
        local, _ = llama_completion(shipped_f32, test_rpc.PROMPT, test_rpc.N_PREDICT, True)
        remote, res = test_rpc.rpc_completion(shipped_f32, [harness.server], True)
        if remote != local:
            tally.failures.append(f"--rpc after the cases gave {remote!r}, locally {local!r}")
    finally:
        harness.server.stop()
    seconds = time.monotonic() - t0
    known = {**KNOWN_UPSTREAM_ABORTS, **KNOWN_UPSTREAM_CRASHES}
    others = sorted({o for _, o, _ in tally.rows} - {REFUSED, NAN, RAN, ABORT, CRASH, "crash"})
    summary = (f"rpc-fuzz: {len(tally.rows)} cases ({len(all_cases) - N_MUTATIONS} written, "
               f"{N_MUTATIONS} mutations, seed {SEED}; server protocol {version}): "
               f"{tally.count(REFUSED)} refused by ggml-rpc, {tally.count(NAN)} NaN from the "
               f"Spark op, {tally.count(RAN)} ran, "
               f"{tally.count(ABORT) + tally.count(CRASH)} server deaths in upstream code "
               f"({tally.count(ABORT)} asserts, {tally.count(CRASH)} SIGSEGV), "
               f"{tally.count('crash')} crashes elsewhere"
               + "".join(f", {tally.count(o)} {o}" for o in others)
               + f"; {harness.starts} server starts, {seconds:.1f} s"
               + "".join(f"; {v}={os.environ[v]}" for v in ("SPARK_FUZZ_RPC_SERVER",
                                                             "SPARK_FUZZ_PLUGIN")
                         if os.environ.get(v)))
    lines = [summary, "server deaths in upstream code (patches/README.md, Known limits):"]
    lines += [f"  {k}: {len(names)} ({'; '.join(names)}) -- {known[k].pattern}"
              for k, names in tally.aborts.items()]
    lines += ["cases:"] + [f"  {o:>15}  {n}  {d.splitlines()[0] if d else ''}"
                           for n, o, d in tally.rows]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "rpc-fuzz.txt").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines[:2 + len(tally.aborts)]))
    assert not tally.failures, "\n".join([summary, *tally.failures,
                                          f"server logs: {[str(p) for p in harness.logs]}"])
