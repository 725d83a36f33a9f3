#!/usr/bin/env python3
"""Gemma 3n GGUF files with random weights, for tests and speed measurement.

    .venv/bin/python tools/gemma3n-synth.py PRESET OUT.gguf [--outtype f32|f16|bf16|q8_0]
                                            [--seed N] [--quiet] [--force]
    .venv/bin/python tools/gemma3n-synth.py --ceiling [PRESET] [--outtype TYPE]

Presets: `tiny` (25 layers of width 128, 512 tokens: every code path of upstream's graph, the
sparse layers 0-9, dense layers, and the KV-sharing layers 20-24 that llama.cpp hard-codes
(`n_layer_kv_from_start = 20`); ~34 MB in f32), `tiny-calm` (tiny whose layers add a tenth as
much to the residual stream: distances between two computations of it are not amplified by 25
random layers), `e2b` and `e4b` (the text model of
google/gemma-3n-E2B-it / -E4B-it: real shapes, the 262400-token vocabulary; e2b is ~4.7 GB in
q8_0, ~8.9 GB in f16).

The file is what upstream llama.cpp's converter (`conversion/gemma.py`, class Gemma3NModel, with
TextModel / Gemma3Model under it) writes for the text model: the same keys (per-layer arrays for
feed_forward_length, sliding_window_pattern and activation_sparsity_scale, -inf for the dense
layers as its icdf(0) gives), the same tensors (tied output: no output.weight; the per-layer
token embedding padded with zero rows above vocab_size_per_layer_input) and its type rule (1-D
tensors, norms and the altup correct/predict coefficients stay F32; a row length that does not
fit the block size falls back to F16). The vocabulary is the synthetic SentencePiece one of
converter/src/tokenizer.rs `synthetic_vocab` (<pad> <eos> <bos> <unk>, the 256 byte pieces,
then characters and letter pairs/triples), so any text tokenizes.

Weights are normal with std 1/sqrt(fan_in) (the token embedding, also the output matrix, 4/sqrt(d):
a peaked next-token distribution; gate pre-activations of the sparse layers are then
close to Gaussian, so the statistical top-k keeps ~5 %); norms ~1; q/k norms head_dim^-1/4 so
that attention scores have unit variance (Gemma 3n's attention scale is 1); altup and laurel
small. Everything is a function of the preset, the type and --seed (each tensor has its own
stream, SeedSequence([seed, crc32(name)])).

Q4_0 / Q4_K_M files are made from an f16 or bf16 file with upstream's quantizer:

    target/upstream/bin/llama-quantize X-f16.gguf X-q4_k_m.gguf Q4_K_M

--ceiling prints, from a preset's shapes, the bytes one decode step reads (every matrix a token
uses: attention (only Q and O in the KV-sharing layers), FFN, altup, laurel, per-layer
projections, the tied output matrix; one gathered row of each embedding), the share of the up and
down rows of the 10 sparse layers, and the decode-speed ceiling 1 / (1 - 0.95 * share) if only 5 %
of those rows were read. Without --outtype it shows q8_0 and q4_0 (1.0625 / 0.5625 bytes per
weight; F32 tensors stay 4).

The output is written to OUT.tmp and renamed at the end; an existing OUT is an error without
--force. Exit status: 0 done, 1 failure, 2 usage error (a bad preset or type).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - depends on the interpreter
    sys.exit("gemma3n-synth.py: the Python package `gguf` is missing: run it with .venv/bin/python "
             "(bash tools/setup.sh makes .venv)")

PROG = "gemma3n-synth.py"
ARCH = "gemma3n"

# llama.cpp's fixed Gemma 3n constants (src/llama-hparams.h, src/models/models.h, gemma3n.cpp)
N_ALTUP = 4            # altup_num_inputs
I_ALTUP_ACT = 0        # altup_active_idx
LAUREL_RANK = 64
N_EMBD_ALTUP = 256     # hidden_size_per_layer_input
N_LAYER_SPARSE = 10    # layers with the Gaussian top-k
N_LAYER_KV_FROM_START = 20
SPARSITY_TARGET = 0.95
# torch.distributions.Normal(0, 1).icdf(0.95) in float32, as the converter writes it (and as
# models.h hard-codes f_sparsity_std_mul)
STD_MUL_095 = 1.6448533535003662

CHUNK_ELEMS = 1 << 24  # values generated at a time (64 MB of f32)


@dataclass(frozen=True)
class Preset:
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int              # vocab_size (token_embd rows, the tokenizer's size)
    n_vocab_per_layer: int    # vocab_size_per_layer_input (per_layer_token_embd rows not 0)
    n_ctx: int                # max_position_embeddings
    sliding_window: int
    n_kv_shared: int          # num_kv_shared_layers
    rope_theta: float = 1_000_000.0
    rope_theta_swa: float = 10_000.0
    rms_eps: float = 1e-6
    softcap: float = 30.0
    swa_period: int = 5       # layer_types: 4 sliding, then 1 full
    # the post-norm weights of each layer's branches (attention, laurel, FFN, per-layer input):
    # the scale of what a layer adds to the residual stream
    branch_norm: float = 1.0

    def sliding(self, il: int) -> bool:
        return (il + 1) % self.swa_period != 0

    def has_kv(self, il: int) -> bool:
        return il < N_LAYER_KV_FROM_START


PRESETS = {
    # tiny: every path of upstream's graph (layers 0-9 sparse, 10-19 dense with their own KV,
    # 20-24 reusing the KV of layers 18 (sliding) and 19 (full)); row lengths multiples of 32
    "tiny": Preset("tiny", n_layer=25, n_embd=128, n_ff=512, n_head=2, n_head_kv=1, head_dim=64,
                   n_vocab=512, n_vocab_per_layer=512, n_ctx=2048, sliding_window=64,
                   n_kv_shared=5),
    # tiny-calm: tiny whose layers each add a tenth as much to the residual stream (branch post-
    # norms 0.1): a perturbation of one layer's output (a rounding of the weights, another sum
    # order) no longer grows through 25 random layers into other tokens, so distances between
    # two computations of it measure the computations, not the model's chaos (tiny: q8_0
    # rounding alone is a mean KLD of 0.065 against f32, 20 % of the top tokens changed)
    "tiny-calm": Preset("tiny-calm", n_layer=25, n_embd=128, n_ff=512, n_head=2, n_head_kv=1,
                        head_dim=64, n_vocab=512, n_vocab_per_layer=512, n_ctx=2048,
                        sliding_window=64, n_kv_shared=5, branch_norm=0.1),
    # google/gemma-3n-E2B-it text_config
    "e2b": Preset("e2b", n_layer=30, n_embd=2048, n_ff=8192, n_head=8, n_head_kv=2, head_dim=256,
                  n_vocab=262400, n_vocab_per_layer=262144, n_ctx=32768, sliding_window=512,
                  n_kv_shared=10),
    # google/gemma-3n-E4B-it text_config
    "e4b": Preset("e4b", n_layer=35, n_embd=2048, n_ff=16384, n_head=8, n_head_kv=2, head_dim=256,
                  n_vocab=262400, n_vocab_per_layer=262144, n_ctx=32768, sliding_window=512,
                  n_kv_shared=15),
}

Q = gguf.GGMLQuantizationType
OUTTYPES = {  # --outtype -> (tensor type of the quantized tensors, general.file_type)
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}
# bytes per weight for --ceiling (q4_0 only there: files of it come from llama-quantize)
BYTES_PER_WEIGHT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


class UsageError(Exception):
    """Exit status 2: a bad preset, type or argument."""


class Failure(Exception):
    """Exit status 1."""


# ---------------------------------------------------------------------------------------------
# the tensors


@dataclass
class Tensor:
    name: str
    shape: tuple[int, int] | tuple[int, ...]  # ggml order: (ne0 = row length, ne1, ne2)
    init: str                  # "normal", "norm", "qknorm", "embd_pl"
    std: float = 0.0
    force_f32: bool = False
    decode: str = "full"       # what a decode step reads: "full", "row" (a gather), "none"
    sparse: bool = False       # up/down of a sparse layer: rows read only for kept neurons
    kind: str = ""             # for the --ceiling breakdown
    scale: float = 1.0         # init "norm": the values' mean

    @property
    def n_elems(self) -> int:
        return int(np.prod(self.shape))

    @property
    def n_rows(self) -> int:
        return self.n_elems // self.shape[0]


def tensors(p: Preset) -> list[Tensor]:
    d, L = p.n_embd, p.n_layer
    q_dim, kv_dim = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    pl = N_EMBD_ALTUP * L
    T = gguf.TENSOR_NAMES
    M = gguf.MODEL_TENSOR

    def n(t, il=None):
        return (T[t].format(bid=il) if il is not None else T[t]) + ".weight"

    def mat(name, n_in, n_out, kind, std=None, **kw):
        return Tensor(name, (n_in, n_out), "normal", std if std is not None else n_in ** -0.5,
                      kind=kind, **kw)

    def norm(name, size, kind="norm", init="norm", scale=1.0):
        return Tensor(name, (size,), init, force_f32=True, kind=kind, scale=scale)

    def post_norm(name):
        return norm(name, d, scale=p.branch_norm)

    out = [
        # tied output: token_embd is also the output matrix (no output.weight), read in full
        # for the logits; its gather for the input is one row
        # std 4/sqrt(d): logits (rms-normed state . embedding row) of std ~4, a peaked next-token
        # distribution, so that greedy decoding has clear winners (1/sqrt(d) left it near uniform)
        Tensor(n(M.TOKEN_EMBD), (d, p.n_vocab), "normal", 4.0 * d ** -0.5, kind="token_embd/output"),
        Tensor(n(M.PER_LAYER_TOKEN_EMBD), (pl, p.n_vocab), "embd_pl", N_EMBD_ALTUP ** -0.5,
               decode="row", kind="per_layer_token_embd (1 row)"),
        mat(n(M.PER_LAYER_MODEL_PROJ), d, pl, "per-layer projections"),
        norm(n(M.PER_LAYER_PROJ_NORM), N_EMBD_ALTUP),
        Tensor(n(M.ALTUP_PROJ), (d, d, N_ALTUP - 1), "normal", d ** -0.5, kind="altup"),
        Tensor(n(M.ALTUP_UNEMBD_PROJ), (d, d, N_ALTUP - 1), "normal", d ** -0.5, kind="altup"),
        norm(n(M.OUTPUT_NORM), d),
    ]
    for il in range(L):
        kv = p.has_kv(il)
        sparse = il < N_LAYER_SPARSE
        out += [
            norm(n(M.ATTN_NORM, il), d),
            mat(n(M.ATTN_Q, il), d, q_dim, "attention"),
            # the KV-sharing layers keep their K and V (the checkpoint has them; the loader
            # requires them) but never compute them
            mat(n(M.ATTN_K, il), d, kv_dim, "attention", decode="full" if kv else "none"),
            mat(n(M.ATTN_V, il), d, kv_dim, "attention", decode="full" if kv else "none"),
            mat(n(M.ATTN_OUT, il), q_dim, d, "attention"),
            norm(n(M.ATTN_Q_NORM, il), p.head_dim, init="qknorm"),
            norm(n(M.ATTN_K_NORM, il), p.head_dim, init="qknorm"),
            post_norm(n(M.ATTN_POST_NORM, il)),
            norm(n(M.FFN_PRE_NORM, il), d),
            mat(n(M.FFN_GATE, il), d, p.n_ff, "ffn gate"),
            mat(n(M.FFN_UP, il), d, p.n_ff, "ffn up+down, sparse layers" if sparse
                else "ffn up+down, dense layers", sparse=sparse),
            mat(n(M.FFN_DOWN, il), p.n_ff, d, "ffn up+down, sparse layers" if sparse
                else "ffn up+down, dense layers", sparse=sparse),
            post_norm(n(M.FFN_POST_NORM, il)),
            mat(n(M.PER_LAYER_INP_GATE, il), d, N_EMBD_ALTUP, "per-layer projections"),
            mat(n(M.PER_LAYER_PROJ, il), N_EMBD_ALTUP, d, "per-layer projections"),
            post_norm(n(M.PER_LAYER_POST_NORM, il)),
            # altup: the router sees rms_norm(x) / n_embd; std 0.5 sqrt(d) gives tanh inputs of
            # std ~0.5; the coefficients are small (the checkpoint's are clipped to 120)
            Tensor(n(M.ALTUP_CORRECT_COEF, il), (N_ALTUP, N_ALTUP), "normal", 0.1,
                   force_f32=True, kind="altup"),
            Tensor(n(M.ALTUP_CORRECT_SCALE, il), (d,), "norm", force_f32=True, kind="altup"),
            Tensor(n(M.ALTUP_PREDICT_COEF, il), (N_ALTUP, N_ALTUP * N_ALTUP), "normal", 0.1,
                   force_f32=True, kind="altup"),
            mat(n(M.ALTUP_ROUTER, il), d, N_ALTUP, "altup", std=0.5 * d ** 0.5),
            norm(n(M.ALTUP_ROUTER_NORM, il), d),
            mat(n(M.LAUREL_L, il), d, LAUREL_RANK, "laurel"),
            mat(n(M.LAUREL_R, il), LAUREL_RANK, d, "laurel"),
            post_norm(n(M.LAUREL_POST_NORM, il)),
        ]
    return out


def tensor_type(t: Tensor, qtype: Q) -> Q:
    """The converter's rule (conversion/base.py, prepare_tensors)."""
    if t.force_f32 or len(t.shape) <= 1 or t.name.endswith("_norm.weight"):
        return Q.F32
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if t.shape[0] % block != 0:  # gguf.QuantError in the converter: it falls back to F16
        return Q.F16
    return qtype


def n_bytes(t: Tensor, ty: Q) -> int:
    block, size = gguf.GGML_QUANT_SIZES[ty]
    return t.n_elems // block * size


# ---------------------------------------------------------------------------------------------
# the values


def rng_for(seed: int, name: str) -> np.random.Generator:
    seq = np.random.SeedSequence([seed, zlib.crc32(name.encode())])
    return np.random.Generator(np.random.PCG64(seq))


def chunks(t: Tensor, p: Preset, seed: int):
    """The tensor's values as float32 arrays of whole rows, in order (numpy shape (rows, ne0))."""
    rng = rng_for(seed, t.name)
    ne0 = t.shape[0]
    if t.init in ("norm", "qknorm"):
        base = p.head_dim ** -0.25 if t.init == "qknorm" else t.scale
        yield (base * (1.0 + 0.05 * rng.standard_normal(ne0, dtype=np.float32))).astype(
            np.float32).reshape(1, ne0)
        return
    rows_total = t.n_rows
    # the rows of vocabulary entries above vocab_size_per_layer_input are 0, as the converter
    # pads the checkpoint's per-layer embedding
    real_rows = p.n_vocab_per_layer if t.init == "embd_pl" else rows_total
    step = max(1, CHUNK_ELEMS // ne0)
    for r0 in range(0, rows_total, step):
        r1 = min(rows_total, r0 + step)
        a = np.zeros((r1 - r0, ne0), dtype=np.float32)
        k = max(0, min(r1, real_rows) - r0)
        if k:
            rng.standard_normal(dtype=np.float32, out=a[:k])
            a[:k] *= np.float32(t.std)
        yield a


def encode(a: np.ndarray, ty: Q) -> np.ndarray:
    if ty == Q.F32:
        return a
    if ty == Q.F16:
        return a.astype(np.float16)
    return gguf.quants.quantize(a, ty)


# ---------------------------------------------------------------------------------------------
# the vocabulary (converter/src/tokenizer.rs synthetic_vocab, same pieces in the same order)


def synthetic_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    TT = gguf.TokenType
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def push(t: str, ty: int) -> None:
        scores.append(-float(len(tokens)) if ty == TT.NORMAL else 0.0)
        tokens.append(t)
        types.append(int(ty))

    for t, ty in [("<pad>", TT.CONTROL), ("<eos>", TT.CONTROL), ("<bos>", TT.CONTROL),
                  ("<unk>", TT.UNKNOWN)]:
        push(t, ty)
    if size < 260:
        raise UsageError(f"a synthetic vocabulary needs at least 260 tokens, asked for {size}")
    for b in range(256):
        push(f"<0x{b:02X}>", TT.BYTE)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
              [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    normal = ["\u2581"] + [chr(c) for c in range(ord("!"), ord("~") + 1)] + \
             ["\u2581" + c for c in letters]
    need = size - 260
    for a in letters:
        for b in letters:
            if len(normal) >= need:
                break
            normal += ["\u2581" + a + b, a + b]
    for a in letters:
        for b in letters:
            for c in letters:
                if len(normal) >= need:
                    break
                normal += ["\u2581" + a + b + c, a + b + c]
    if len(normal) < need:
        raise UsageError(f"a synthetic vocabulary cannot have {size} tokens")
    for t in normal[:need]:
        push(t, TT.NORMAL)
    return tokens, scores, types


def vocab(p: Preset) -> tuple[list[str], list[float], list[int]]:
    """The synthetic vocabulary of vocab_size_per_layer_input pieces, then (e2b, e4b) the
    converter's padding up to vocab_size: "[PAD<id>]", UNUSED, score -10000."""
    tokens, scores, types = synthetic_vocab(p.n_vocab_per_layer)
    for i in range(p.n_vocab_per_layer, p.n_vocab):
        tokens.append(f"[PAD{i}]")
        scores.append(-10000.0)
        types.append(int(gguf.TokenType.UNUSED))
    return tokens, scores, types


# ---------------------------------------------------------------------------------------------
# the file


def add_metadata(w: gguf.GGUFWriter, p: Preset, outtype: str, seed: int) -> None:
    L = p.n_layer
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"gemma3n-synth {p.name} (random weights, seed {seed})")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(OUTTYPES[outtype][1])
    # TextModel.set_gguf_parameters, then Gemma3Model's, then Gemma3NModel's
    w.add_block_count(L)
    w.add_context_length(p.n_ctx)
    w.add_embedding_length(p.n_embd)
    w.add_feed_forward_length([p.n_ff] * L)   # intermediate_size is a per-layer list
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_rope_freq_base(p.rope_theta)
    w.add_rope_freq_base_swa(p.rope_theta_swa)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.head_dim)
    w.add_final_logit_softcapping(p.softcap)
    w.add_sliding_window(p.sliding_window)
    w.add_altup_active_idx(I_ALTUP_ACT)
    w.add_altup_num_inputs(N_ALTUP)
    w.add_embedding_length_per_layer_input(N_EMBD_ALTUP)
    w.add_shared_kv_layers(p.n_kv_shared)
    # activation_sparsity_pattern: 0.95 for the first 10 layers, 0 after; icdf(0) = -inf
    w.add_activation_sparsity_scale([STD_MUL_095 if il < N_LAYER_SPARSE else float("-inf")
                                     for il in range(L)])
    w.add_sliding_window_pattern([p.sliding(il) for il in range(L)])
    # Gemma3Model.set_vocab: SentencePiece, no space prefix; SpecialVocab's ids and flags
    tokens, scores, types = vocab(p)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)


class Progress:
    def __init__(self, quiet: bool):
        self.on = not quiet and sys.stderr.isatty()
        self.last = 0.0

    def show(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.on and (force or now - self.last > 0.1):
            self.last = now
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()

    def done(self) -> None:
        if self.on:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def generate(p: Preset, out: Path, outtype: str, seed: int, quiet: bool, force: bool) -> None:
    if out.exists() and not force:
        raise Failure(f"{out} exists (--force overwrites it)")
    qtype = OUTTYPES[outtype][0]
    ts = tensors(p)
    types = [tensor_type(t, qtype) for t in ts]
    tmp = out.with_name(out.name + ".tmp")
    need = sum(n_bytes(t, ty) for t, ty in zip(ts, types))
    try:
        free = shutil.disk_usage(out.parent if str(out.parent) else ".").free
    except OSError as e:
        raise Failure(f"{out.parent}: {e.strerror}") from None
    if need > free:
        raise Failure(f"{out}: needs {need / 1e9:.1f} GB, {out.parent} has "
                      f"{free / 1e9:.1f} GB free")
    t0 = time.monotonic()
    w = gguf.GGUFWriter(None, ARCH)
    try:
        add_metadata(w, p, outtype, seed)
        for t, ty in zip(ts, types):
            # numpy order of the shape; tensor_dtype float32 with raw_dtype: the shape as given
            w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32),
                              n_bytes(t, ty), raw_dtype=ty)
        w.write_header_to_file(tmp)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        fout = w.fout[0]
        w.write_padding(fout, fout.tell())
        total = sum(n_bytes(t, ty) for t, ty in zip(ts, types))
        done = 0
        prog = Progress(quiet)
        for i, (t, ty) in enumerate(zip(ts, types)):
            written = 0
            for a in chunks(t, p, seed):
                b = encode(a, ty)
                b.tofile(fout)
                written += b.nbytes
                done += b.nbytes
                prog.show(f"{PROG}: tensor {i + 1}/{len(ts)} {t.name} ({ty.name}) "
                          f"{done / 2**20:,.0f}/{total / 2**20:,.0f} MiB")
            if written != n_bytes(t, ty):
                raise RuntimeError(f"internal: {t.name}: wrote {written} bytes, expected "
                                   f"{n_bytes(t, ty)}")
            w.write_padding(fout, written)
        prog.done()
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    if not quiet:
        print(f"{PROG}: wrote {out} ({p.name}, {outtype}, seed {seed}): {len(ts)} tensors, "
              f"{out.stat().st_size / 1e9:.3f} GB in {time.monotonic() - t0:.0f} s",
              file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# --ceiling


def decode_bytes(p: Preset, outtype: str) -> tuple[float, float, dict[str, float]]:
    """(bytes a decode step reads, of which the sparse layers' up+down, per kind)."""
    bpw = BYTES_PER_WEIGHT[outtype]
    total = sparse = 0.0
    kinds: dict[str, float] = {}
    for t in tensors(p):
        f32 = t.force_f32 or len(t.shape) <= 1
        b = 4.0 if f32 else bpw
        if t.decode == "none":
            continue
        elems = t.shape[0] if t.decode == "row" else t.n_elems
        nb = elems * b
        total += nb
        if t.sparse:
            sparse += nb
        kinds[t.kind] = kinds.get(t.kind, 0.0) + nb
    return total, sparse, kinds


def ceiling(names: list[str], outtypes: list[str]) -> None:
    print(f"Gemma 3n decode: bytes of weights read per token (every matrix a token uses; one row "
          f"of each embedding gather; KV-sharing layers {N_LAYER_KV_FROM_START}+ read Q and O "
          f"only; "
          f"F32 tensors at 4 B), the share of the up+down rows of the {N_LAYER_SPARSE} sparse "
          f"layers, and the decode-speed ceiling 1 / (1 - {SPARSITY_TARGET} * share) if only "
          f"{100 * (1 - SPARSITY_TARGET):.0f} % of those rows are read")
    print()
    print(f"| preset | type | B/weight | MB/token | sparse up+down MB | share | ceiling |")
    print(f"|---|---|---|---|---|---|---|")
    for name in names:
        p = PRESETS[name]
        for ot in outtypes:
            total, sparse, _ = decode_bytes(p, ot)
            share = sparse / total
            print(f"| {name} | {ot} | {BYTES_PER_WEIGHT[ot]:.4f} | {total / 1e6:,.1f} | "
                  f"{sparse / 1e6:,.1f} | {100 * share:.1f} % | "
                  f"{1 / (1 - SPARSITY_TARGET * share):.3f}x |")
    print()
    for name in names:
        p = PRESETS[name]
        total, _, kinds = decode_bytes(p, outtypes[0])
        parts = ", ".join(f"{k} {100 * v / total:.1f} %"
                          for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        print(f"{name} ({outtypes[0]}) by part: {parts}")


# ---------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description="Gemma 3n GGUF files with random weights (docstring: --help-long)",
        epilog="presets: " + ", ".join(PRESETS) + "; Q4_0/Q4_K_M: llama-quantize of an f16/bf16 "
               "file")
    ap.add_argument("preset", nargs="?", help="tiny, tiny-calm, e2b or e4b")
    ap.add_argument("out", nargs="?", type=Path, help="the GGUF file to write")
    ap.add_argument("--outtype", help="f32 (default), f16, bf16, q8_0; --ceiling: also q4_0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no progress, no summary")
    ap.add_argument("--force", action="store_true", help="overwrite OUT")
    ap.add_argument("--ceiling", action="store_true",
                    help="print the decode bytes and speed ceiling table instead (PRESET "
                         "optional: e2b and e4b; --outtype optional: q8_0 and q4_0)")
    ap.add_argument("--help-long", action="store_true", help="the full description")
    a = ap.parse_args(argv)
    if a.help_long:
        print(__doc__)
        return 0
    try:
        if a.preset is not None and a.preset not in PRESETS:
            raise UsageError(f"unknown preset {a.preset!r} (presets: {', '.join(PRESETS)})")
        if a.ceiling:
            if a.out is not None:
                raise UsageError("--ceiling writes no file: give at most a preset")
            if a.outtype is not None and a.outtype not in BYTES_PER_WEIGHT:
                raise UsageError(f"unknown --outtype {a.outtype!r} (for --ceiling: "
                                 f"{', '.join(BYTES_PER_WEIGHT)})")
            ceiling([a.preset] if a.preset else ["e2b", "e4b"],
                    [a.outtype] if a.outtype else ["q8_0", "q4_0"])
            return 0
        if a.preset is None or a.out is None:
            raise UsageError("give a preset and an output file: "
                             f"{PROG} PRESET OUT.gguf (presets: {', '.join(PRESETS)})")
        outtype = a.outtype or "f32"
        if outtype not in OUTTYPES:
            hint = (": make an f16 or bf16 file and quantize it with upstream's llama-quantize"
                    if outtype.lower().startswith(("q4", "q5", "q6", "q3", "q2", "iq")) else "")
            raise UsageError(f"unknown --outtype {outtype!r} ({', '.join(OUTTYPES)}){hint}")
        generate(PRESETS[a.preset], a.out, outtype, a.seed, a.quiet, a.force)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except Failure as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted, nothing written", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
