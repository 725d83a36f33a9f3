"""`spark-convert --pair-k2v` (SPEC section 3, `blk.N.ffn_k2v`): the same small models converted
with and without the option and read back with gguf-py. Each paired row holds exactly the bytes
of the neuron's `ffn_up` (K2) row followed by its `ffn_down_t` (V) row, which are also gguf-py's
encoding of SPEC's arrays; the type rule and its fallback; `spark-gguf validate` accepts the file
and names its layout; dense models are refused; `spark quantize` keeps the layout, and where the
asked type's blocks would split a row's parts gives ffn_k2v llama.cpp's fallback type."""

from __future__ import annotations

import os
import subprocess

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from convert_helpers import binary, run_convert, validate
from spark_checkpoint import default_tiny_config, load_checkpoint, make_checkpoint, save_checkpoint

ENCODE = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}


def make(tmp_path, sp_model, name="ck.npz", **cfg):
    path = tmp_path / name
    save_checkpoint(str(path), make_checkpoint(default_tiny_config(**cfg), seed=2),
                    tokenizer_bytes=sp_model.read_bytes())
    return path


def tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def row_bytes(t) -> np.ndarray:
    """The tensor's rows as a uint8 array of shape (rows, bytes per row)."""
    raw = np.ascontiguousarray(t.data).view(np.uint8)
    return raw.reshape(int(t.shape[1]), -1)


def encode(a: np.ndarray, ty: QT) -> np.ndarray:
    """gguf-py's bytes of `a` (float) stored as `ty`, per row."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if ty == QT.F32:
        out = a
    elif ty == QT.F16:
        out = a.astype(np.float16)
    else:
        out = gguf.quants.quantize(a, ty)
    return np.ascontiguousarray(out).view(np.uint8).reshape(a.shape[0], -1)


def check_paired(paired, separate, n_layers, want_type):
    """Every ffn_k2v row == ffn_up row ++ ffn_down_t row of `separate`; every other tensor the
    same bytes; tensor order with ffn_k2v where ffn_up was. Returns the two readers' tensors."""
    p, s = tensors(paired), tensors(separate)
    assert list(p) == [n.replace(".ffn_up.", ".ffn_k2v.") for n in s if ".ffn_down_t." not in n]
    for name, t in p.items():
        if ".ffn_k2v." not in name:
            assert t.tensor_type == s[name].tensor_type, name
            assert np.asarray(t.data).tobytes() == np.asarray(s[name].data).tobytes(), name
    for l in range(n_layers):
        k2v, up, down = p[f"blk.{l}.ffn_k2v.weight"], s[f"blk.{l}.ffn_up.weight"], s[f"blk.{l}.ffn_down_t.weight"]
        assert k2v.tensor_type == want_type, (l, k2v.tensor_type)
        assert up.tensor_type == down.tensor_type == want_type, (up.tensor_type, down.tensor_type)
        # ggml ne [(D - r_f) + D, F]
        assert [int(x) for x in k2v.shape] == [int(up.shape[0]) + int(down.shape[0]), int(up.shape[1])]
        np.testing.assert_array_equal(row_bytes(k2v), np.concatenate([row_bytes(up), row_bytes(down)], axis=1))
    return p, s


def spec_k2v(weights: dict, cfg: dict, l: int) -> np.ndarray:
    """SPEC's paired matrix of layer `l` (numpy shape (F, 2D - r_f)): K2.T beside mlp/linear."""
    k2 = weights[f"transformer/layer_{l}/mlp/spark_in"][cfg["ffn_r"]:]
    return np.concatenate([k2.T, weights[f"transformer/layer_{l}/mlp/linear"]], axis=1)


def spark_gguf_validate(path) -> str:
    p = subprocess.run([str(binary("spark-gguf")), "validate", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.parametrize("outtype,stacked", [("f32", False), ("f16", False), ("bf16", False), ("q8_0", False),
                                             ("f32", True), ("q8_0", True)])
def test_paired_rows_are_the_separate_rows_side_by_side(tmp_path, sp_model, outtype, stacked):
    ck = make(tmp_path, sp_model)  # D 64, r_f 32: both parts of a row whole q8_0 blocks
    extra = ["--stack-qkv"] if stacked else []
    sep, par = tmp_path / "separate.gguf", tmp_path / "paired.gguf"
    run_convert(ck, sep, "--outtype", outtype, *extra, "--quiet")
    p = run_convert(ck, par, "--outtype", outtype, *extra, "--pair-k2v")
    per_layer = (9 if stacked else 11) - 1
    assert f"wrote {par}: {2 + 2 * per_layer} tensors" in p.stdout
    assert "stored as f16" not in p.stderr
    layout = "attn_qkv stacked, ffn_k2v paired" if stacked else "ffn_k2v paired"
    assert spark_gguf_validate(par).startswith(f"{par}: valid ({2 + 2 * per_layer} tensors, ")
    assert f", {layout})" in spark_gguf_validate(par)
    validate(sep)
    cfg, w = load_checkpoint(str(ck))
    paired, _ = check_paired(par, sep, cfg["n_layers"], ENCODE[outtype])
    # and the bytes are gguf-py's encoding of SPEC's matrix
    for l in range(cfg["n_layers"]):
        want = encode(spec_k2v(w, cfg, l), ENCODE[outtype])
        np.testing.assert_array_equal(row_bytes(paired[f"blk.{l}.ffn_k2v.weight"]), want)


@pytest.mark.parametrize("d_model,ffn_r", [(64, 40), (48, 32)])
def test_q8_0_falls_back_to_f16_when_a_part_is_not_whole_blocks(tmp_path, sp_model, d_model, ffn_r):
    # (64, 40): K2 rows of 24 values; (48, 32): rows of 16 + 48 = 64 values are two whole blocks,
    # but each part is not. Either way f16, the rows of the f16 conversion.
    ck = make(tmp_path, sp_model, d_model=d_model, ffn_r=ffn_r)
    par, f16 = tmp_path / "paired.gguf", tmp_path / "f16.gguf"
    p = run_convert(ck, par, "--outtype", "q8_0", "--pair-k2v")
    widths = f"{d_model - ffn_r} + {d_model}"
    assert (f"blk.0.ffn_k2v.weight: the parts of a row ({widths}) are not all multiples of 32, "
            "stored as f16 instead of q8_0") in p.stderr
    validate(par)
    run_convert(ck, f16, "--outtype", "f16", "--quiet")
    cfg, w = load_checkpoint(str(ck))
    p_t, f_t = tensors(par), tensors(f16)
    for l in range(cfg["n_layers"]):
        k2v = p_t[f"blk.{l}.ffn_k2v.weight"]
        assert k2v.tensor_type == QT.F16
        up, down = f_t[f"blk.{l}.ffn_up.weight"], f_t[f"blk.{l}.ffn_down_t.weight"]
        np.testing.assert_array_equal(row_bytes(k2v), np.concatenate([row_bytes(up), row_bytes(down)], axis=1))
        np.testing.assert_array_equal(row_bytes(k2v), encode(spec_k2v(w, cfg, l), QT.F16))


def test_rows_written_in_several_blocks(tmp_path, sp_model):
    # rows of 512 + 1024 values, 4096 neurons: the converter writes them in two blocks of rows
    ck = make(tmp_path, sp_model, d_model=1024, ffn_r=512, d_ff=4096, n_layers=1)
    sep, par = tmp_path / "separate.gguf", tmp_path / "paired.gguf"
    run_convert(ck, sep, "--outtype", "q8_0", "--quiet")
    run_convert(ck, par, "--outtype", "q8_0", "--pair-k2v", "--quiet")
    validate(par)
    check_paired(par, sep, 1, QT.Q8_0)


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_synthetic_preset_pairs_the_same_values(tmp_path, outtype):
    sep, par = tmp_path / "separate.gguf", tmp_path / "paired.gguf"
    run_convert("--synthetic", "tiny", sep, "--outtype", outtype, "--seed", "3", "--quiet")
    run_convert("--synthetic", "tiny", par, "--outtype", outtype, "--seed", "3", "--pair-k2v", "--quiet")
    validate(par)
    check_paired(par, sep, 2, ENCODE[outtype])


def assert_fails(outdir, args, *needles):
    """spark-convert fails with every needle in its message and leaves outdir as it was."""
    before = sorted(os.listdir(outdir))
    p = run_convert(*args, check=False)
    assert p.returncode != 0, p.stdout
    assert "panicked" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, f"{n!r} not in {p.stderr!r}"
    assert sorted(os.listdir(outdir)) == before, "output or temp file left behind"


def test_pair_k2v_is_refused_for_dense_models(tmp_path, sp_model):
    outdir = tmp_path / "out"
    outdir.mkdir()
    assert_fails(outdir, ["--synthetic", "tiny-dense", outdir / "d.gguf", "--pair-k2v"],
                 "spark-convert: error: --pair-k2v does not apply to the dense preset 'tiny-dense'")
    dense = tmp_path / "dense.npz"
    save_checkpoint(str(dense), make_checkpoint(default_tiny_config(), seed=4, dense=True),
                    tokenizer_bytes=sp_model.read_bytes())
    assert_fails(outdir, [dense, outdir / "d.gguf", "--pair-k2v"],
                 "spark-convert: error: --pair-k2v applies to Spark checkpoints; this one is dense")
    run_convert(dense, tmp_path / "dense.gguf", "--quiet")  # the checkpoint itself converts


def test_a_non_finite_value_names_the_paired_row(tmp_path, sp_model):
    arrays = make_checkpoint(default_tiny_config(), seed=6)
    linear = arrays["transformer/layer_1/mlp/linear"].copy()  # [F, D]: row j = neuron j's V
    linear[37, 5] = np.nan
    arrays["transformer/layer_1/mlp/linear"] = linear
    ck = tmp_path / "nan.npz"
    save_checkpoint(str(ck), arrays, tokenizer_bytes=sp_model.read_bytes())
    outdir = tmp_path / "out"
    outdir.mkdir()
    assert_fails(outdir, [ck, outdir / "m.gguf", "--pair-k2v"], "transformer/layer_1/mlp/linear", "non-finite",
                 "row 37 of tensor 'blk.1.ffn_k2v.weight'")


def spark_quantize(src, dst, qtype) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("spark")), "quantize", str(src), str(dst), qtype, "--quiet"],
                          capture_output=True, text=True, timeout=120)


def test_spark_quantize_keeps_the_paired_layout(tmp_path):
    sep, par = tmp_path / "separate.gguf", tmp_path / "paired.gguf"
    run_convert("--synthetic", "tiny", sep, "--outtype", "f32", "--quiet")
    run_convert("--synthetic", "tiny", par, "--outtype", "f32", "--pair-k2v", "--quiet")
    for qtype, ty in [("Q8_0", QT.Q8_0), ("Q4_0", QT.Q4_0)]:
        qs, qp = tmp_path / f"s-{qtype}.gguf", tmp_path / f"p-{qtype}.gguf"
        for src, dst in [(sep, qs), (par, qp)]:
            p = spark_quantize(src, dst, qtype)
            assert p.returncode == 0, p.stderr
        assert ", ffn_k2v paired)" in spark_gguf_validate(qp)
        # llama.cpp's quantizer writes the tensors in its own order: compare by name
        s, q = tensors(qs), tensors(qp)
        assert set(q) == {n.replace(".ffn_up.", ".ffn_k2v.") for n in s if ".ffn_down_t." not in n}
        for l in range(2):
            k2v, up, down = q[f"blk.{l}.ffn_k2v.weight"], s[f"blk.{l}.ffn_up.weight"], s[f"blk.{l}.ffn_down_t.weight"]
            assert k2v.tensor_type == up.tensor_type == down.tensor_type == ty, qtype
            np.testing.assert_array_equal(row_bytes(k2v), np.concatenate([row_bytes(up), row_bytes(down)], axis=1))


def test_spark_quantize_falls_back_to_a_type_that_keeps_a_row_s_parts_whole(tmp_path, sp_model):
    # D 384, r_f 256: a row of 128 + 384 = 512 values is two whole q4_K blocks, but K2's part
    # would end in the middle of the first. llama.cpp's quantizer (patch 0024) falls back as for
    # a row that q4_K does not divide: q5_0, whose 32-value blocks divide both parts
    ck = make(tmp_path, sp_model, d_model=384, ffn_r=256, d_ff=64, n_layers=1)
    par = tmp_path / "paired.gguf"
    run_convert(ck, par, "--outtype", "f32", "--pair-k2v", "--quiet")
    out = tmp_path / "q4.gguf"
    p = spark_quantize(par, out, "Q4_K_M")
    assert p.returncode == 0, p.stderr
    assert ", ffn_k2v paired)" in spark_gguf_validate(out)
    k2v = tensors(out)["blk.0.ffn_k2v.weight"]
    assert k2v.tensor_type == QT.Q5_0
    # the bytes are gguf-py's q5_0 of the f32 rows (each part whole blocks, so the row's
    # encoding is the parts' encodings side by side)
    f32 = tensors(par)["blk.0.ffn_k2v.weight"]
    rows = np.asarray(f32.data, dtype=np.float32).reshape(int(f32.shape[1]), -1)
    np.testing.assert_array_equal(row_bytes(k2v), encode(rows, QT.Q5_0))
    # and llama.cpp's loader, which refuses a K2 part that ends inside a block, runs it
    r = subprocess.run([str(binary("spark")), "run", "-m", str(out), "-p", "a b", "-n", "2", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr