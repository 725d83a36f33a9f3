"""Graphs of the RPC fuzz test (test_rpc_fuzz.py) as specs, what a client sends before it is
placed in a server buffer: tensor specs (TS) and Spark nodes (Node), the good nodes every case
starts from (f32, and quantized weights with their own strides), their numpy references (SPEC
section 4, docs/INTERFACES.md; written from those, not from the kernels), and `Placed`, which
puts a case's tensors in one server buffer between guard bytes.

Guard bytes: the buffer is cleared to the case's guard byte before anything is placed, and every
tensor follows a gap of GAP such bytes. After the graph ran, every byte outside the nodes'
outputs must be as it was (a write outside dst shows), and the harness runs a computed case a
second time with another guard byte: a read outside the tensors the node was given changes its
output then."""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import numpy as np

from upstream_helpers import UPSTREAM, sibling_module

rpc = sibling_module("spark_rpc_client", "rpc_client.py")

# ggml's numbers, from the installed header (empty when tools/upstream.sh has not run: the test
# then fails saying so, collection does not)
GGML_H = UPSTREAM / "include" / "ggml.h"
TYPES, OPS, LIMITS = rpc.ggml_header_constants(GGML_H) if GGML_H.is_file() else ({}, {}, {})
TYPE_NAMES = {v: k for k, v in TYPES.items()}

# The FFN: D model width, R = r_f, W = D - R the width of K2, F neurons, T tokens, P chunks.
D, R, F, T, P = 64, 16, 32, 3, 4
W = D - R
# Quantized weights: K2 as wide as h (r = 0, as Gemma 3n) so that its rows are whole blocks of
# every type, q4_K's 256 included.
DQ = 256
# Attention: head width, query heads, KV heads, tokens, streams, cache positions, r_a, k_a.
AH, AN, AKV, AT, AS, ANKV, AR, AK = 8, 2, 1, 2, 1, 4, 4, 4

SENTINEL = -12345.0  # what an f32 dst holds before a case


@dataclass
class TS:
    """A tensor of a case: type, ne, strides (None: contiguous), values (None: random; f32 as
    numpy, other types as their bytes, np.uint8), and where it lies: "arena" (in the case's
    buffer), "nodata" (no buffer, data 0), "foreign" (a buffer id the server never gave, data
    non-zero), "past_end" (starts 16 bytes before its buffer's end), "before_start" (64 bytes
    before its buffer), "misaligned" (2 bytes past an aligned offset). `alias`: another spec whose
    bytes this one shares (same address; it writes no values of its own). `poison`: (index,
    value) pairs written over the values: f32 elements, or for a quantized type the f16 scale of
    block `index`."""
    type: str = "F32"
    ne: tuple = (1,)
    nb: tuple | None = None
    values: object = None
    place: str = "arena"
    alias: object = None
    poison: tuple = ()


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
    params_format: str = rpc.OP_PARAMS_FORMAT  # spark_rope's: rpc.ROPE_PARAMS_FORMAT


def ne4(ne) -> tuple:
    return tuple(ne) + (1,) * (4 - len(ne))


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


# ---------------------------------------------------------------------------------------------
# quantized weights: gguf-py (an independent implementation of ggml's formats) writes and reads
# them


def gguf_type(name: str):
    from gguf.constants import GGMLQuantizationType
    return GGMLQuantizationType[name]


def quantized(rng, type_name: str, cols: int, rows: int) -> np.ndarray:
    """Valid `type_name` bytes of a [cols, rows] weight (ggml order), as np.uint8: gguf-py's
    quantizer where it has one, else random blocks whose f16 scales are set to small finite
    values (q4_K: d, dmin at bytes 0-3 of each 144-byte block)."""
    from gguf import quants
    x = (rng.standard_normal((rows, cols)) * 0.5).astype(np.float32)
    try:
        return np.ascontiguousarray(quants.quantize(x, gguf_type(type_name))).reshape(-1)
    except NotImplementedError:
        pass
    size, block = elem(type_name)
    blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    scales = (rng.random((blocks.shape[0], 2)) * 0.02 + 0.001).astype(np.float16)
    blocks[:, :4] = scales.view(np.uint8).reshape(-1, 4)
    return blocks.reshape(-1)


def dequantized(t: TS) -> np.ndarray:
    """A weight spec's values as float64 [rows, cols] (numpy order: ne1, ne0)."""
    ne = ne4(t.ne)
    if t.type == "F32":
        return np.asarray(t.values, np.float64).reshape(ne[1], ne[0])
    if t.type == "F16":
        return np.frombuffer(np.asarray(t.values, np.uint8).tobytes(), "<f2").astype(
            np.float64).reshape(ne[1], ne[0])
    from gguf import quants
    size, block = elem(t.type)
    raw = np.asarray(t.values, np.uint8).reshape(ne[1], ne[0] // block * size)
    return quants.dequantize(raw, gguf_type(t.type)).astype(np.float64).reshape(ne[1], ne[0])


def activations_as_dotted(x: np.ndarray, weight_type: str) -> np.ndarray:
    """Rows of f32 activations as ggml's CPU dot product with a `weight_type` row sees them:
    quantized to that type's vec_dot type and read back (ggml-quants.c's q8_0 and q8_K
    quantizers, written again here from their definitions: q8_0, per 32: d = amax / 127 stored
    as f16, q = round(x * 127 / amax), half to even as the AVX2 code rounds; q8_K, per 256: the
    element of largest magnitude `m` gets -127, q = min(127, round(-127 / m * x)), d = -m / 127
    kept in f32). Other weight types dot f32 (f16 rows are widened)."""
    x = np.asarray(x, np.float32)
    if weight_type in ("F32", "F16"):
        return x.astype(np.float64)
    block = 256 if weight_type.endswith("_K") else 32
    b = x.reshape(-1, block)
    if block == 32:
        amax = np.abs(b).max(axis=1, keepdims=True)
        d = amax / np.float32(127)
        with np.errstate(divide="ignore"):
            iscale = np.where(amax == 0, np.float32(0), np.float32(127) / amax)
        q = np.rint(b * iscale.astype(np.float32))
        out = q * d.astype(np.float16).astype(np.float32)
    else:
        at = np.abs(b).argmax(axis=1)
        m = b[np.arange(b.shape[0]), at][:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = np.where(m == 0, np.float32(0), np.float32(-127) / m).astype(np.float32)
            q = np.minimum(np.float32(127), np.rint(iscale * b))
            out = np.where(m == 0, 0, q * (np.float32(1) / iscale))
    return out.reshape(x.shape).astype(np.float64)


def weight(rng, type_name: str, cols: int, rows: int) -> TS:
    if type_name == "F32":
        return TS("F32", (cols, rows), values=rand_values(rng, TS(ne=(cols, rows))))
    if type_name == "F16":
        v = (rng.standard_normal(cols * rows) * 0.5).astype(np.float16)
        return TS("F16", (cols, rows), values=v.view(np.uint8))
    return TS(type_name, (cols, rows), values=quantized(rng, type_name, cols, rows))


# ---------------------------------------------------------------------------------------------
# good nodes


def good_up(rng, k=F, wtype="F32", d=D, r=R):
    s = TS("F32", (F, T), values=rand_values(rng, TS(ne=(F, T))))
    h = TS("F32", (d, T), values=rand_values(rng, TS(ne=(d, T))))
    k2 = weight(rng, wtype, d - r, F)
    return Node("spark_ffn_up", [s, h, k2], TS("F32", (T, F)), (0, k, 0, 0.0))


def good_down(rng, up=None, wtype="F32", d=D):
    up = up or good_up(rng)
    v = weight(rng, wtype, d, F)
    return Node("spark_ffn_down", [up, v], TS("F32", (d, T)), (0, F, 0, 0.0))


def good_fused(rng, k=F, wtype="F32", d=D, r=R):
    up = good_up(rng, k, wtype, d, r)
    v = weight(rng, wtype, d, F)
    return Node("spark_ffn_fused", [*up.srcs, v], TS("F32", (d, T, P)), (1, k, 0, 0.0))


def good_sum(rng):
    return Node("spark_ffn_sum", [good_fused(rng)], TS("F32", (D, T)), (1, F, 0, 0.0))


def good_attn(rng, k=AK, cache="F32"):
    q = TS("F32", (AH, AN, AT, AS), values=rand_values(rng, TS(ne=(AH, AN, AT, AS))))
    kv = []
    for _ in range(2):
        if cache == "F32":
            kv.append(TS("F32", (AH, AKV, ANKV, AS),
                         values=rand_values(rng, TS(ne=(AH, AKV, ANKV, AS)))))
        else:
            v = (rng.standard_normal(AH * AKV * ANKV * AS) * 0.5).astype(np.float16)
            kv.append(TS("F16", (AH, AKV, ANKV, AS), values=v.view(np.uint8)))
    mask = TS("F32", (ANKV, AT, 1, AS), values=np.zeros(ANKV * AT * AS, np.float32))
    return Node("spark_attn", [q, *kv, mask], TS("F32", (AH, AN, AT, AS)), (2, k, AR, 0.0))


# spark_rope: x [AH, AN, AT] (a head of AH = 8: parts of AR = 4 and 4), positions [AT] i32
ROPE_POS = (3, 700)


def good_rope(rng):
    x = TS("F32", (AH, AN, AT), values=rand_values(rng, TS(ne=(AH, AN, AT))))
    pos = TS("I32", (AT,), values=np.array(ROPE_POS, np.int32).view(np.uint8))
    return Node("spark_rope", [x, pos], TS("F32", (AH, AN, AT)), (4, AR, 10000.0, 1.0, 0.5, 0),
                params_format=rpc.ROPE_PARAMS_FORMAT)


def quantized_variants(op: str, make) -> dict:
    """`make` with weights of each type the CPU kernels read through their own code (f16, q8_0,
    q4_0, and q4_K, whose blocks are 256 wide), at width DQ."""
    return {f"{op} {w.lower()}": (lambda rng, w=w: make(rng, wtype=w, d=DQ, **(
        {} if op == "spark_ffn_down" else {"r": 0})))
            for w in ("F16", "Q8_0", "Q4_0", "Q4_K")}


# The good nodes by label: the written cases change one of them, mutations any.
GOOD = {"spark_ffn_up": good_up, "spark_ffn_down": good_down, "spark_ffn_fused": good_fused,
        "spark_ffn_sum": good_sum, "spark_attn": good_attn, "spark_rope": good_rope,
        "spark_attn f16 cache": lambda rng: good_attn(rng, cache="F16"),
        **quantized_variants("spark_ffn_up", good_up),
        **quantized_variants("spark_ffn_down", lambda rng, wtype, d: good_down(
            rng, good_up(rng), wtype, d)),
        **quantized_variants("spark_ffn_fused", good_fused)}


# numpy references (SPEC 4; docs/INTERFACES.md: k >= F keeps every neuron, unshifted; k_a >=
# the valid positions keeps every position)


def arr(t: TS, shape) -> np.ndarray:
    """An f32 spec's values as numpy, in ggml's order reversed (ne0 fastest -> last axis)."""
    return np.asarray(t.values, np.float64).reshape(shape)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def ffn_u(up: Node) -> np.ndarray:
    """u [F, T] (the op's dst u [T, F] read as numpy) of a dense spark_ffn_up."""
    s, h, k2 = up.srcs[:3]
    d, w = ne4(h.ne)[0], ne4(k2.ne)[0]
    s, h = arr(s, (T, F)), activations_as_dotted(arr(h, (T, d))[:, d - w:], k2.type)
    return (gelu_tanh(s) * (h @ dequantized(k2).T)).T


def ffn_partials(fused: Node) -> np.ndarray:
    s, h, k2, v = fused.srcs
    d, w = ne4(h.ne)[0], ne4(k2.ne)[0]
    h = activations_as_dotted(arr(h, (T, d))[:, d - w:], k2.type)
    u = gelu_tanh(arr(s, (T, F))) * (h @ dequantized(k2).T)  # [T, F]
    v = dequantized(v)  # [F, d]
    return np.stack([u[:, c * F // P:(c + 1) * F // P] @ v[c * F // P:(c + 1) * F // P]
                     for c in range(P)])  # [P, T, d]


def attn_ref(node: Node) -> np.ndarray:
    q = arr(node.srcs[0], (AS, AT, AN, AH))
    k, v = (dequantized(TS(t.type, (AH, AKV * ANKV * AS), values=t.values)).reshape(
        AS, ANKV, AKV, AH) for t in node.srcs[1:3])
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


def rope_ref(node: Node) -> np.ndarray:
    """SPEC 4's rotary embedding of each part (widths r and AH - r), NEOX pairs, times scale."""
    x = arr(node.srcs[0], (AT, AN, AH))
    _, r, base, freq_scale, scale, _ = node.params
    out = np.zeros_like(x)
    for t, pos in enumerate(ROPE_POS):
        for off, w in ((0, r), (r, AH - r)):
            i = np.arange(w // 2)
            theta = pos * freq_scale * float(base) ** (-2.0 * i / w)
            # (x[t] first: x[t, :, idx] would put idx's axis in front, numpy's mixed indexing)
            x0, x1 = x[t][:, off + i], x[t][:, off + i + w // 2]
            out[t][:, off + i] = scale * (x0 * np.cos(theta) - x1 * np.sin(theta))
            out[t][:, off + i + w // 2] = scale * (x0 * np.sin(theta) + x1 * np.cos(theta))
    return out


def reference(node: Node) -> tuple[np.ndarray, float] | None:
    """What a good node computes, as its dst reads (numpy order), and the tolerance (relative,
    and of the output's scale): f32 arithmetic throughout (a weight's rows are dequantized, the
    activations of a quantized K2 are quantized as ggml's dot product does,
    activations_as_dotted); a quantized K2 gets 1e-4 (a rounding tie, rare, may move one
    element of h by a step); None for a node that is not good."""
    quant_k2 = lambda n: n.srcs[2].type not in ("F32", "F16")  # noqa: E731
    if node.op == "spark_ffn_up":
        return ffn_u(node), 1e-4 if quant_k2(node) else 1e-5
    if node.op == "spark_ffn_down" and isinstance(node.srcs[0], TS):
        return arr(node.srcs[0], (F, T)).T @ dequantized(node.srcs[1]), 1e-5
    if node.op == "spark_ffn_fused":
        return ffn_partials(node), 1e-4 if quant_k2(node) else 1e-5
    if node.op == "spark_attn":
        return attn_ref(node), 1e-5
    if node.op == "spark_rope":
        return rope_ref(node), 1e-5
    return None


# ---------------------------------------------------------------------------------------------
# placing specs in a server buffer


class Placed:
    """The tensors of one case in one server buffer (an rpc.Arena of the case's connection),
    cleared to `guard` and each after GAP guard bytes (module docs)."""

    ARENA_BYTES = 1 << 20
    GAP = 64
    GUARD = 0x5A

    def __init__(self, client, rng, guard: int = GUARD):
        self.client = client
        self.rng = rng
        self.arena = rpc.Arena(client, self.ARENA_BYTES, TYPES)
        client.buffer_clear(self.arena.remote, guard)
        self.made: dict[int, rpc.Tensor] = {}
        self.regions: dict[int, tuple[int, int]] = {}  # id(spec) -> (address, bytes) in arena
        self.outputs: set[int] = set()  # the regions a graph may write (its nodes' dst)
        self.aliased = False  # a tensor shares another's bytes (its output may race its input)

    def reserve(self, nbytes: int, misalign: int = 0) -> int:
        a = self.arena
        off = -(-(a.used + self.GAP) // a.align) * a.align + misalign
        a.used = off + nbytes
        return a.base + off

    def values(self, t: TS, nbytes: int) -> bytes:
        """The bytes a spec is written with: its values or random ones, then its poison."""
        values = t.values
        if values is None and t.type == "F32":
            values = (self.rng.standard_normal(nbytes // 4) * 0.5).astype(np.float32)
        if isinstance(values, np.ndarray) and values.dtype == np.float32:
            values = values.copy()
            for i, x in t.poison:
                values[i % values.size] = x
            return values.astype("<f4").tobytes()
        raw = bytearray(bytes(values) if values is not None
                        else self.rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
        size = elem(t.type)[0]
        for i, x in t.poison:  # a quantized block's f16 scale (its first two bytes)
            at = (i * size) % max(len(raw) - 1, 1)
            with np.errstate(over="ignore"):  # (3e38 becomes inf)
                raw[at:at + 2] = np.float16(x).tobytes()
        return bytes(raw)

    def tensor(self, t: TS, fill: bytes | None = None) -> rpc.Tensor:
        """The tensor of spec `t`, placed as it says and written with its values (random ones
        when it has none) or with `fill` repeated."""
        key = id(t)
        if key in self.made:
            return self.made[key]
        ne, nb, nbytes = ne4(t.ne), strides(t), ggml_nbytes(t)
        a = self.arena
        buffer, data = a.remote, 0
        if t.alias is not None:
            self.aliased = True
            data = self.tensor(t.alias).data
            self.regions[key] = (data, nbytes)
            a.used = max(a.used, data - a.base + nbytes)
            fill = None
        elif t.place == "nodata":
            buffer = 0
        elif t.place == "foreign":
            buffer, data = 0xDEAD0000, 0x10000
        elif t.place == "past_end":
            data = a.base + a.size - 16
        elif t.place == "before_start":
            data = a.base - 64
        elif nbytes > a.size - a.used - 2 * self.GAP:
            data = a.base + a.used  # does not fit: the server sees a tensor past its buffer
        else:
            data = self.reserve(nbytes, 2 if t.place == "misaligned" else 0)
            self.regions[key] = (data, nbytes)
        out = rpc.Tensor(TYPES[t.type] if isinstance(t.type, str) else t.type, ne, nb,
                         buffer=buffer, data=data)
        if key in self.regions and nbytes and t.alias is None:
            payload = self.values(t, nbytes) if fill is None \
                else (fill * (nbytes // len(fill) + 1))[:nbytes]
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
        params = rpc.custom_op_params(op_id, n.params, n.n_tasks, n.magic, n.call_state,
                                      n.params_format)
        if n.params is None:
            params = params[:24]
        node = dataclasses.replace(dst, op=OPS[n.ggml_op], op_params=params,
                                   flags=rpc.FLAG_COMPUTE, src=[s or 0 for s in srcs],
                                   name=n.op)
        self.made[key] = node
        self.regions[key] = self.regions.get(id(n.dst), (0, 0))
        self.outputs.add(key)
        return node

    def read_at(self, addr: int, nbytes: int) -> bytes:
        if nbytes == 0:
            return b""
        reader = rpc.Tensor(TYPES["I8"], (nbytes, 1, 1, 1), (1, nbytes, nbytes, nbytes),
                            buffer=self.arena.remote, data=addr)
        return self.client.get_tensor(reader, nbytes)

    def read(self, spec) -> bytes | None:
        """The bytes of a spec's region (None: it has none in the arena)."""
        addr, nbytes = self.regions.get(id(spec), (0, 0))
        return self.read_at(addr, nbytes) if addr else None

    def span(self) -> bytes:
        """The arena's bytes up to a gap past the last tensor."""
        return self.read_at(self.arena.base, min(self.arena.size, self.arena.used + self.GAP))

    def changed_outside_outputs(self, before: bytes, after: bytes) -> list[tuple[int, int]]:
        """(offset, byte count) of each run of bytes that differ between two spans outside the
        regions the graph's nodes may write."""
        a = np.frombuffer(before, np.uint8)
        b = np.frombuffer(after[:len(before)], np.uint8)
        diff = a != b
        for key in self.outputs:
            addr, nbytes = self.regions.get(key, (0, 0))
            lo = max(addr - self.arena.base, 0)
            diff[lo:lo + nbytes] = False
        at = np.flatnonzero(diff)
        if at.size == 0:
            return []
        runs = np.split(at, np.flatnonzero(np.diff(at) != 1) + 1)
        return [(int(r[0]), int(r.size)) for r in runs]

