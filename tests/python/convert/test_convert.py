"""spark-convert end to end: checkpoints from the reference generator, converted, validated by
`spark-gguf validate`, read back with gguf-py and compared with numpy transforms of SPEC 3/5."""

from __future__ import annotations

import json
import os
import zipfile

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from convert_helpers import run_convert, validate
from spark_checkpoint import default_tiny_config, load_checkpoint, make_checkpoint, save_checkpoint

SPARK = "spark-gemma2"


def expected_tensors(cfg: dict, w: dict, dense: bool, stacked: bool = False) -> dict:
    """GGUF tensor name -> numpy array (shape = reversed ggml ne), per SPEC sections 3 and 5."""
    V, D, L = cfg["vocab_size"], cfg["d_model"], cfg["n_layers"]
    N, KV, H, F, rf = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"], cfg["d_ff"], cfg["ffn_r"]
    out = {
        "token_embd.weight": w["transformer/embedder/input_embedding"][:V],
        "output_norm.weight": 1 + w["transformer/final_norm/scale"],
    }
    for l in range(L):
        p, b = f"transformer/layer_{l}/", f"blk.{l}."
        kv = w[p + "attn/kv_einsum/w"]
        out[b + "attn_norm.weight"] = 1 + w[p + "pre_attention_norm/scale"]
        # HF q_proj [N*H, D] = q_einsum.transpose(0, 2, 1).reshape(N*H, D); ggml ne [D, N*H].
        wq = w[p + "attn/q_einsum/w"].transpose(0, 2, 1).reshape(N * H, D)
        wk = kv[0].transpose(0, 2, 1).reshape(KV * H, D)
        wv = kv[1].transpose(0, 2, 1).reshape(KV * H, D)
        if stacked:  # --stack-qkv: one tensor, ggml ne [D, (N + 2 KV) H]
            out[b + "attn_qkv.weight"] = np.concatenate([wq, wk, wv])
        else:
            out[b + "attn_q.weight"], out[b + "attn_k.weight"], out[b + "attn_v.weight"] = wq, wk, wv
        # HF o_proj [D, N*H]; ggml ne [N*H, D].
        out[b + "attn_output.weight"] = w[p + "attn/attn_vec_einsum/w"].reshape(N * H, D).T
        out[b + "post_attention_norm.weight"] = 1 + w[p + "post_attention_norm/scale"]
        out[b + "ffn_norm.weight"] = 1 + w[p + "pre_ffw_norm/scale"]
        out[b + "post_ffw_norm.weight"] = 1 + w[p + "post_ffw_norm/scale"]
        if dense:
            g = w[p + "mlp/gating_einsum"]  # [2, D, F]
            out[b + "ffn_gate.weight"] = g[0].T
            out[b + "ffn_up.weight"] = g[1].T
            out[b + "ffn_down.weight"] = w[p + "mlp/linear"].T
        else:
            if p + "mlp/spark_in" in w:
                k1, k2 = w[p + "mlp/spark_in"][:rf], w[p + "mlp/spark_in"][rf:]
            else:
                k1, k2 = w[p + "mlp/spark_k1"], w[p + "mlp/spark_k2"]
            out[b + "ffn_gate.weight"] = k1.T  # row j = neuron j's predictor weights
            out[b + "ffn_up.weight"] = k2.T
            out[b + "ffn_down_t.weight"] = w[p + "mlp/linear"]  # neuron-major V
    return out


def tensor_bytes(t) -> bytes:
    return np.ascontiguousarray(t.data).tobytes()


def check_tensors(path, cfg, weights, dense, outtype, src_type=QT.F32, stacked=False):
    """Every tensor: right name, shape and type, and bytes equal to gguf-py's encoding of the
    expected array (f32/f16 exactly by numpy, bf16/q8_0 by gguf.quants)."""
    r = gguf.GGUFReader(path)
    exp = expected_tensors(cfg, weights, dense, stacked)
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(exp)
    for name, e in exp.items():
        t = got[name]
        e32 = np.ascontiguousarray(e, dtype=np.float32)
        assert list(t.shape) == list(reversed(e32.shape)), name
        if e32.ndim == 1:
            want = QT.F32
        else:
            want = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "auto": src_type}.get(outtype)
            if outtype == "q8_0":
                want = QT.Q8_0 if e32.shape[-1] % 32 == 0 else QT.F16
        assert t.tensor_type == want, (name, t.tensor_type, want)
        if want == QT.F32:
            np.testing.assert_array_equal(np.asarray(t.data).reshape(e32.shape), e32, err_msg=name)
        elif want == QT.F16:
            assert tensor_bytes(t) == e32.astype(np.float16).tobytes(), name
        else:
            assert tensor_bytes(t) == gguf.quants.quantize(e32, want).tobytes(), name
            deq = gguf.quants.dequantize(np.asarray(t.data), want).reshape(e32.shape)
            tol = 0.01 if want == QT.Q8_0 else 0.008
            assert np.max(np.abs(deq - e32)) <= tol * max(1.0, np.max(np.abs(e32))), name
    return r


def field(r, key):
    f = r.fields[key]
    return f.types, f.contents()


def make(tmp_path, name="ckpt.npz", cfg=None, seed=0, dtype="float32", compressed=False, split_k=False,
         dense=False, vocab_pad=0, tokenizer=None):
    cfg = cfg or default_tiny_config()
    arrays = make_checkpoint(cfg, seed=seed, split_k=split_k, dense=dense, vocab_pad=vocab_pad)
    path = tmp_path / name
    save_checkpoint(str(path), arrays, dtype=dtype, compressed=compressed, tokenizer_bytes=tokenizer)
    return path


@pytest.fixture
def outdir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0", "auto"])
def test_fused_f32_checkpoint_all_outtypes(tmp_path, outdir, sp_model, outtype):
    ck = make(tmp_path, tokenizer=sp_model.read_bytes(), vocab_pad=16)
    out = outdir / "m.gguf"
    p = run_convert(ck, out, "--outtype", outtype)
    assert f"wrote {out}: 24 tensors" in p.stdout
    validate(out)
    cfg, w = load_checkpoint(str(ck))
    r = check_tensors(out, cfg, w, dense=False, outtype=outtype)
    file_type = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "auto": 0}[outtype]
    assert field(r, "general.file_type") == ([VT.UINT32], file_type)
    assert field(r, "general.quantization_version") == ([VT.UINT32], 2)


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_stack_qkv_writes_wq_wk_wv_as_one_tensor(tmp_path, outdir, sp_model, outtype):
    ck = make(tmp_path, tokenizer=sp_model.read_bytes(), vocab_pad=16)
    out = outdir / "m.gguf"
    p = run_convert(ck, out, "--outtype", outtype, "--stack-qkv")
    assert f"wrote {out}: 20 tensors" in p.stdout  # 2 global + 9 per layer
    validate(out)
    cfg, w = load_checkpoint(str(ck))
    check_tensors(out, cfg, w, dense=False, outtype=outtype, stacked=True)


def test_stack_qkv_is_refused_for_a_dense_checkpoint_and_preset(tmp_path, outdir):
    assert_fails(outdir, ["--synthetic", "tiny-dense", outdir / "d.gguf", "--stack-qkv"],
                 "--stack-qkv does not apply to the dense preset 'tiny-dense'")


@pytest.mark.parametrize("dtype,compressed,split_k", [
    ("bfloat16", False, False), ("bfloat16", True, True), ("float16", True, False), ("float16", False, True),
    ("float32", True, True)])
def test_checkpoint_dtypes_storage_and_split_k(tmp_path, outdir, sp_model, dtype, compressed, split_k):
    ck = make(tmp_path, dtype=dtype, compressed=compressed, split_k=split_k, tokenizer=sp_model.read_bytes(), seed=3)
    with zipfile.ZipFile(ck) as z:
        methods = {i.compress_type for i in z.infolist()}
    assert methods == {zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED}
    cfg, w = load_checkpoint(str(ck))
    src = {"float32": QT.F32, "float16": QT.F16, "bfloat16": QT.BF16}[dtype]
    for outtype in ["auto", "q8_0"]:
        out = outdir / f"m-{outtype}.gguf"
        run_convert(ck, out, "--outtype", outtype, "--quiet")
        validate(out)
        check_tensors(out, cfg, w, dense=False, outtype=outtype, src_type=src)


def test_dense_checkpoint_converts_to_gemma2(tmp_path, outdir, sp_model):
    ck = make(tmp_path, dense=True, tokenizer=sp_model.read_bytes(), seed=5)
    cfg, w = load_checkpoint(str(ck))
    for outtype in ["f32", "q8_0"]:
        out = outdir / f"d-{outtype}.gguf"
        run_convert(ck, out, "--outtype", outtype)
        validate(out)
        r = check_tensors(out, cfg, w, dense=True, outtype=outtype)
        assert field(r, "general.architecture") == ([VT.STRING], "gemma2")
        assert not any(k.startswith("gemma2.spark.") for k in r.fields)
        assert field(r, "gemma2.feed_forward_length") == ([VT.UINT32], cfg["d_ff"])


def test_dense_checkpoint_in_f_d_layout(tmp_path, outdir, sp_model):
    cfg = default_tiny_config()
    arrays = make_checkpoint(cfg, seed=9, dense=True)
    for l in range(cfg["n_layers"]):
        key = f"transformer/layer_{l}/mlp/gating_einsum"
        arrays[key] = np.ascontiguousarray(arrays[key].transpose(0, 2, 1))  # [2, F, D]
    ck = tmp_path / "fd.npz"
    save_checkpoint(str(ck), arrays, tokenizer_bytes=sp_model.read_bytes())
    out = outdir / "fd.gguf"
    run_convert(ck, out)
    validate(out)
    cfg2, w = load_checkpoint(str(ck))
    for l in range(cfg["n_layers"]):
        key = f"transformer/layer_{l}/mlp/gating_einsum"
        w[key] = w[key].transpose(0, 2, 1)  # back to [2, D, F] for expected_tensors
    check_tensors(out, cfg2, w, dense=True, outtype="auto")


def test_metadata_keys_and_exact_types(tmp_path, outdir, sp_model):
    ck = make(tmp_path, tokenizer=sp_model.read_bytes())
    out = outdir / "m.gguf"
    run_convert(ck, out, "--name", "tiny spark", "--ffn-k", "33", "--attn-k", "5")
    r = gguf.GGUFReader(out)
    cfg = default_tiny_config()
    u32 = [VT.UINT32]
    f32 = [VT.FLOAT32]
    expect = {
        "general.architecture": ([VT.STRING], SPARK),
        "general.name": ([VT.STRING], "tiny spark"),
        f"{SPARK}.context_length": (u32, cfg["max_position_embeddings"]),
        f"{SPARK}.embedding_length": (u32, cfg["d_model"]),
        f"{SPARK}.block_count": (u32, cfg["n_layers"]),
        f"{SPARK}.feed_forward_length": (u32, cfg["d_ff"]),
        f"{SPARK}.attention.head_count": (u32, cfg["n_heads"]),
        f"{SPARK}.attention.head_count_kv": (u32, cfg["n_kv_heads"]),
        f"{SPARK}.attention.key_length": (u32, cfg["head_dim"]),
        f"{SPARK}.attention.value_length": (u32, cfg["head_dim"]),
        f"{SPARK}.attention.sliding_window": (u32, cfg["sliding_window"]),
        f"{SPARK}.spark.ffn_k": (u32, 33),
        f"{SPARK}.spark.ffn_r": (u32, cfg["ffn_r"]),
        f"{SPARK}.spark.attn_k": (u32, 5),
        f"{SPARK}.spark.attn_r": (u32, cfg["attn_r"]),
        "tokenizer.ggml.model": ([VT.STRING], "llama"),
        "tokenizer.ggml.bos_token_id": (u32, 2),
        "tokenizer.ggml.eos_token_id": (u32, 1),
        "tokenizer.ggml.padding_token_id": (u32, 0),
        "tokenizer.ggml.unknown_token_id": (u32, 3),
        "tokenizer.ggml.add_bos_token": ([VT.BOOL], True),
    }
    for k, v in expect.items():
        assert field(r, k) == v, k
    floats = {
        f"{SPARK}.attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
        f"{SPARK}.attention.scale": 1 / np.sqrt(cfg["query_pre_attn_scalar"]),
        f"{SPARK}.attn_logit_softcapping": cfg["attn_logit_softcap"],
        f"{SPARK}.final_logit_softcapping": cfg["final_logit_softcap"],
        f"{SPARK}.rope.freq_base": cfg["rope_theta"],
    }
    for k, v in floats.items():
        types, val = field(r, k)
        assert types == f32 and val == pytest.approx(np.float32(v)), k


def check_vocab_matches_model(r, model_path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    n = sp.get_piece_size()
    assert field(r, "tokenizer.ggml.tokens") == ([VT.ARRAY, VT.STRING], [sp.id_to_piece(i) for i in range(n)])
    types, scores = field(r, "tokenizer.ggml.scores")
    assert types == [VT.ARRAY, VT.FLOAT32]
    assert scores == [pytest.approx(sp.get_score(i)) for i in range(n)]

    def sp_type(i):
        if sp.is_unknown(i):
            return 2
        if sp.is_control(i):
            return 3
        if sp.is_byte(i):
            return 6
        if sp.is_unused(i):
            return 5
        return 1

    assert field(r, "tokenizer.ggml.token_type") == ([VT.ARRAY, VT.INT32], [sp_type(i) for i in range(n)])


def test_tokenizer_sources(tmp_path, outdir, sp_model):
    # From the npz entry, from --tokenizer, and from --vocab-from: the same keys.
    with_entry = make(tmp_path, "a.npz", tokenizer=sp_model.read_bytes())
    without = make(tmp_path, "b.npz")
    run_convert(with_entry, outdir / "a.gguf")
    run_convert(without, outdir / "b.gguf", "--tokenizer", sp_model)
    run_convert(without, outdir / "c.gguf", "--vocab-from", outdir / "a.gguf")
    readers = [gguf.GGUFReader(outdir / n) for n in ["a.gguf", "b.gguf", "c.gguf"]]
    for r in readers:
        check_vocab_matches_model(r, sp_model)
    tok_keys = [sorted(k for k in r.fields if k.startswith("tokenizer.")) for r in readers]
    assert tok_keys[0] == tok_keys[1] == tok_keys[2]
    for n in ["a.gguf", "b.gguf", "c.gguf"]:
        validate(outdir / n)


def test_q8_0_falls_back_to_f16_for_odd_rows(tmp_path, outdir, sp_model):
    cfg = default_tiny_config(ffn_r=40)  # K1 rows of 40, K2 rows of 24: not multiples of 32
    ck = make(tmp_path, cfg=cfg, tokenizer=sp_model.read_bytes())
    out = outdir / "q.gguf"
    p = run_convert(ck, out, "--outtype", "q8_0")
    assert "blk.0.ffn_gate.weight: row length 40 is not a multiple of 32, stored as f16" in p.stderr
    validate(out)
    c, w = load_checkpoint(str(ck))
    r = check_tensors(out, c, w, dense=False, outtype="q8_0")
    assert field(r, "general.file_type") == ([VT.UINT32], 7)


def test_synthetic_tiny_presets(outdir):
    for preset, arch in [("tiny", SPARK), ("tiny-dense", "gemma2")]:
        out = outdir / f"{preset}.gguf"
        p = run_convert("--synthetic", preset, out, "--seed", "7")
        assert "wrote" in p.stdout
        validate(out)
        r = gguf.GGUFReader(out)
        assert field(r, "general.architecture") == ([VT.STRING], arch)
        tokens = field(r, "tokenizer.ggml.tokens")[1]
        assert tokens[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"]
        assert tokens[4:260] == [f"<0x{b:02X}>" for b in range(256)]
        assert len(set(tokens)) == len(tokens) == 512
        emb = next(t for t in r.tensors if t.name == "token_embd.weight")
        e = gguf.quants.dequantize(np.asarray(emb.data), emb.tensor_type)
        assert abs(float(np.std(e)) - 1 / np.sqrt(128)) < 0.01
        norm = next(t for t in r.tensors if t.name == "output_norm.weight")
        assert abs(float(np.mean(norm.data)) - 1) < 0.05


def test_synthetic_is_deterministic_across_thread_counts(outdir):
    env1 = dict(os.environ, RAYON_NUM_THREADS="1")
    env3 = dict(os.environ, RAYON_NUM_THREADS="3")
    run_convert("--synthetic", "tiny", outdir / "a.gguf", "--seed", "11", "--outtype", "q8_0", env=env1)
    run_convert("--synthetic", "tiny", outdir / "b.gguf", "--seed", "11", "--outtype", "q8_0", env=env3)
    run_convert("--synthetic", "tiny", outdir / "c.gguf", "--seed", "12", "--outtype", "q8_0")
    a, b, c = ((outdir / n).read_bytes() for n in ["a.gguf", "b.gguf", "c.gguf"])
    assert a == b
    assert a != c


# ---------------------------------------------------------------- bad input


def assert_fails(outdir, args, *needles):
    """spark-convert fails with every needle in its message and leaves outdir empty."""
    before = sorted(os.listdir(outdir))
    p = run_convert(*args, check=False)
    assert p.returncode != 0, p.stdout
    assert "panicked" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, f"{n!r} not in {p.stderr!r}"
    assert sorted(os.listdir(outdir)) == before, "output or temp file left behind"
    return p


def save_raw(path, arrays: dict, config: dict | str | None = None):
    out = dict(arrays)
    if config is not None:
        out["config"] = np.array(config if isinstance(config, str) else json.dumps(config))
    with open(path, "wb") as f:
        np.savez(f, **out)


@pytest.fixture
def tiny_arrays(sp_model):
    arrays = make_checkpoint(default_tiny_config(), seed=1)
    arrays["tokenizer"] = np.frombuffer(sp_model.read_bytes(), dtype=np.uint8)
    return arrays


def test_bad_entries(tmp_path, outdir, tiny_arrays):
    out = outdir / "m.gguf"
    a = dict(tiny_arrays)
    del a["transformer/layer_1/attn/q_einsum/w"]
    save_raw(tmp_path / "missing.npz", a)
    assert_fails(outdir, [tmp_path / "missing.npz", out], "transformer/layer_1/attn/q_einsum/w", "missing")

    a = dict(tiny_arrays, **{"transformer/layer_0/mlp/extra": np.zeros(3, np.float32)})
    save_raw(tmp_path / "extra.npz", a)
    assert_fails(outdir, [tmp_path / "extra.npz", out], "transformer/layer_0/mlp/extra", "unexpected")

    a = dict(tiny_arrays)
    a["transformer/layer_0/mlp/linear"] = a["transformer/layer_0/mlp/linear"][:, :-1]
    save_raw(tmp_path / "shape.npz", a)
    assert_fails(outdir, [tmp_path / "shape.npz", out], "transformer/layer_0/mlp/linear", "[256, 63]", "[256, 64]")

    a = dict(tiny_arrays)
    a["transformer/layer_1/attn/kv_einsum/w"] = a["transformer/layer_1/attn/kv_einsum/w"].copy()
    a["transformer/layer_1/attn/kv_einsum/w"][1, 0, 3, 2] = np.nan
    save_raw(tmp_path / "nan.npz", a)
    # V's half of kv_einsum, KV head 0, column h = 2: row 2 of attn_v, row N*H + KV*H + 2 of the
    # stacked attn_qkv
    assert_fails(outdir, [tmp_path / "nan.npz", out], "transformer/layer_1/attn/kv_einsum/w", "non-finite",
                 "row 2 of tensor 'blk.1.attn_v.weight'")
    n, _, h = a["transformer/layer_1/attn/q_einsum/w"].shape
    kv = a["transformer/layer_1/attn/kv_einsum/w"].shape[1]
    assert_fails(outdir, [tmp_path / "nan.npz", out, "--stack-qkv"], "transformer/layer_1/attn/kv_einsum/w",
                 "non-finite", f"row {n * h + kv * h + 2} of tensor 'blk.1.attn_qkv.weight'")

    a = dict(tiny_arrays)
    a["transformer/final_norm/scale"] = a["transformer/final_norm/scale"].copy()
    a["transformer/final_norm/scale"][5] = np.inf
    save_raw(tmp_path / "inf.npz", a)
    assert_fails(outdir, [tmp_path / "inf.npz", out], "transformer/final_norm/scale", "non-finite")

    a = dict(tiny_arrays)
    a["transformer/layer_0/attn/q_einsum/w"] = np.asfortranarray(a["transformer/layer_0/attn/q_einsum/w"])
    save_raw(tmp_path / "fortran.npz", a)
    assert_fails(outdir, [tmp_path / "fortran.npz", out], "transformer/layer_0/attn/q_einsum/w", "Fortran")

    a = dict(tiny_arrays)
    a["transformer/layer_0/post_ffw_norm/scale"] = a["transformer/layer_0/post_ffw_norm/scale"].astype(np.float64)
    save_raw(tmp_path / "f64.npz", a)
    assert_fails(outdir, [tmp_path / "f64.npz", out], "transformer/layer_0/post_ffw_norm/scale", "<f8")

    a = {k: v for k, v in tiny_arrays.items() if k != "config"}
    save_raw(tmp_path / "noconfig.npz", a)
    assert_fails(outdir, [tmp_path / "noconfig.npz", out], "'config'", "missing")


def test_bad_config(tmp_path, outdir, tiny_arrays):
    out = outdir / "m.gguf"
    save_raw(tmp_path / "json.npz", tiny_arrays, config='{"vocab_size": 512,')
    assert_fails(outdir, [tmp_path / "json.npz", out], "config", "invalid JSON")
    cfg = default_tiny_config()
    del cfg["d_ff"]
    save_raw(tmp_path / "key.npz", tiny_arrays, config=cfg)
    assert_fails(outdir, [tmp_path / "key.npz", out], "missing key 'd_ff'")
    save_raw(tmp_path / "neg.npz", tiny_arrays, config=default_tiny_config(n_heads=-4))
    assert_fails(outdir, [tmp_path / "neg.npz", out], "'n_heads'")
    # Invalid Spark parameters (SPEC 2), from the config and from the command line.
    save_raw(tmp_path / "r.npz", tiny_arrays, config=default_tiny_config(attn_r=7))
    assert_fails(outdir, [tmp_path / "r.npz", out], "attn_r", "even")
    good = tmp_path / "good.npz"
    save_raw(good, tiny_arrays)
    assert_fails(outdir, [good, out, "--ffn-r", "64"], "ffn_r", "0 < r_f < D")
    assert_fails(outdir, [good, out, "--ffn-r", "0"], "ffn_r")
    assert_fails(outdir, [good, out, "--attn-r", "16"], "attn_r", "0 < r_a < H")
    assert_fails(outdir, [good, out, "--ffn-k", "0"], "ffn_k", "at least 1")
    assert_fails(outdir, [good, out, "--attn-k", "0"], "attn_k", "at least 1")
    save_raw(tmp_path / "kv.npz", tiny_arrays, config=default_tiny_config(n_kv_heads=3))
    assert_fails(outdir, [tmp_path / "kv.npz", out], "head_count_kv", "does not divide")
    # A config whose shapes disagree with the arrays.
    save_raw(tmp_path / "d.npz", tiny_arrays, config=default_tiny_config(d_ff=128))
    assert_fails(outdir, [tmp_path / "d.npz", out], "has shape", "the config calls for")


def test_bad_files_and_output(tmp_path, outdir, tiny_arrays):
    out = outdir / "m.gguf"
    good = tmp_path / "good.npz"
    save_raw(good, tiny_arrays)
    data = good.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    assert_fails(outdir, [tmp_path / "trunc.npz", out], "trunc.npz")
    (tmp_path / "text.npz").write_text("this is not a zip file\n")
    assert_fails(outdir, [tmp_path / "text.npz", out], "text.npz", "zip")
    assert_fails(outdir, [tmp_path / "absent.npz", out], "absent.npz")
    # A compressed member whose data is corrupt: CRC or inflate error, named.
    comp = tmp_path / "comp.npz"
    with open(comp, "wb") as f:
        np.savez_compressed(f, **tiny_arrays)
    raw = bytearray(comp.read_bytes())
    with zipfile.ZipFile(comp) as z:
        info = z.getinfo("transformer/embedder/input_embedding.npy")
    name_len, extra_len = np.frombuffer(bytes(raw[info.header_offset + 26:info.header_offset + 30]), "<u2")
    start = info.header_offset + 30 + int(name_len) + int(extra_len)
    for i in range(start + info.compress_size // 2, start + info.compress_size // 2 + 64):
        raw[i] ^= 0x5A
    (tmp_path / "corrupt.npz").write_bytes(bytes(raw))
    assert_fails(outdir, [tmp_path / "corrupt.npz", out], "input_embedding")

    # Existing output without --force: refused and untouched; with --force: replaced.
    out.write_bytes(b"keep me")
    p = run_convert(good, out, check=False)
    assert p.returncode != 0 and "--force" in p.stderr
    assert out.read_bytes() == b"keep me"
    assert os.listdir(outdir) == ["m.gguf"]
    run_convert(good, out, "--force")
    validate(out)


def test_uint8_config_entry_and_cli_tokenizer_precedence(tmp_path, outdir, tiny_arrays, sp_model):
    arrays = dict(tiny_arrays)
    cfg = default_tiny_config(n_layers=1)
    arrays = make_checkpoint(cfg, seed=4)
    arrays["config"] = np.frombuffer(json.dumps(cfg).encode(), dtype=np.uint8)
    arrays["tokenizer"] = np.frombuffer(b"not a model", dtype=np.uint8)
    ck = tmp_path / "u8.npz"
    save_raw(ck, arrays)
    assert_fails(outdir, [ck, outdir / "x.gguf"], "'tokenizer'", "SentencePiece")
    out = outdir / "u8.gguf"
    p = run_convert(ck, out, "--tokenizer", sp_model)
    assert "--tokenizer" in p.stderr and "'tokenizer' entry" in p.stderr  # the note says which wins
    validate(out)
    c, w = load_checkpoint(str(ck))
    check_tensors(out, c, w, dense=False, outtype="auto")


def test_bad_command_lines(tmp_path, outdir, tiny_arrays, sp_model):
    good = tmp_path / "good.npz"
    save_raw(good, tiny_arrays)
    out = outdir / "m.gguf"
    assert_fails(outdir, ["--synthetic", "huge", out], "unknown preset 'huge'")
    assert_fails(outdir, ["--synthetic", "tiny", good, out], "only the output path")
    assert_fails(outdir, ["--synthetic", "tiny-dense", out, "--ffn-k", "3"], "dense")
    assert_fails(outdir, [good], "IN.npz OUT.gguf")
    assert_fails(outdir, [good, out, "--outtype", "q4_k"], "--outtype")
    assert_fails(outdir, [good, out, "--input-dtype", "int8"], "--input-dtype")
    assert_fails(outdir, [good, out, "--tokenizer", sp_model, "--vocab-from", good], "not both")


# ---------------------------------------------------------------- chat template

# Gemma's chat template (as in its tokenizer_config.json) plus non-ASCII text and trailing
# whitespace, so that any trimming or re-encoding shows.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n'"
    " + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}\u2581caf\u00e9 \t\n"
)


def chat_template(path):
    r = gguf.GGUFReader(path)
    if "tokenizer.chat_template" not in r.fields:
        return None
    types, text = field(r, "tokenizer.chat_template")
    assert types == [VT.STRING]
    return text


def test_chat_template_reads_back_exactly_via_gguf_py(tmp_path, outdir, tiny_arrays):
    plain = tmp_path / "plain.npz"
    save_raw(plain, tiny_arrays)
    jinja = tmp_path / "gemma.jinja"
    jinja.write_bytes(CHAT_TEMPLATE.encode("utf-8"))
    # np.savez(chat_template=text) writes a 0-d unicode array; a 1-d uint8 (UTF-8) one also works.
    uni = tmp_path / "uni.npz"
    save_raw(uni, dict(tiny_arrays, chat_template=np.array(CHAT_TEMPLATE)))
    u8 = tmp_path / "u8.npz"
    save_raw(u8, dict(tiny_arrays, chat_template=np.frombuffer(CHAT_TEMPLATE.encode(), dtype=np.uint8)))
    run_convert(plain, outdir / "text.gguf", "--chat-template", CHAT_TEMPLATE)
    run_convert(plain, outdir / "file.gguf", "--chat-template", f"@{jinja}")
    run_convert(uni, outdir / "uni.gguf")
    run_convert(u8, outdir / "u8.gguf")
    run_convert("--synthetic", "tiny", outdir / "syn.gguf", "--chat-template", f"@{jinja}")
    for n in ["text", "file", "uni", "u8", "syn"]:
        assert chat_template(outdir / f"{n}.gguf") == CHAT_TEMPLATE, n
        validate(outdir / f"{n}.gguf")
    run_convert(plain, outdir / "none.gguf")
    assert chat_template(outdir / "none.gguf") is None


def test_chat_template_precedence_flag_checkpoint_vocab_from(tmp_path, outdir, tiny_arrays):
    plain, entry = tmp_path / "plain.npz", tmp_path / "entry.npz"
    save_raw(plain, tiny_arrays)
    save_raw(entry, dict(tiny_arrays, chat_template=np.array("from the checkpoint")))
    vocab = tmp_path / "vocab.gguf"
    run_convert(plain, vocab, "--chat-template", "from vocab-from")
    run_convert(plain, outdir / "a.gguf", "--vocab-from", vocab)
    assert chat_template(outdir / "a.gguf") == "from vocab-from"
    p = run_convert(entry, outdir / "b.gguf", "--vocab-from", vocab)
    assert chat_template(outdir / "b.gguf") == "from the checkpoint"
    assert "replaced by the checkpoint's 'chat_template' entry" in p.stderr
    run_convert(entry, outdir / "c.gguf", "--vocab-from", vocab, "--chat-template", "from the flag")
    assert chat_template(outdir / "c.gguf") == "from the flag"
    p = run_convert(entry, outdir / "d.gguf", "--chat-template", "from the flag")
    assert chat_template(outdir / "d.gguf") == "from the flag"
    assert "'chat_template' entry is ignored" in p.stderr


def test_chat_template_errors(tmp_path, outdir, tiny_arrays):
    out = outdir / "m.gguf"
    plain = tmp_path / "plain.npz"
    save_raw(plain, tiny_arrays)
    missing = tmp_path / "missing.jinja"
    assert_fails(outdir, [plain, out, "--chat-template", f"@{missing}"], str(missing), "cannot read")
    latin1 = tmp_path / "latin1.jinja"
    latin1.write_bytes("caf\u00e9".encode("latin-1"))
    assert_fails(outdir, [plain, out, "--chat-template", f"@{latin1}"], str(latin1), "UTF-8")
    assert_fails(outdir, [plain, out, "--chat-template", ""], "--chat-template is empty")
    for name, value in [("empty", np.frombuffer(b"", dtype=np.uint8)), ("blank", np.array("  \n")),
                        ("float", np.zeros(3, np.float32))]:
        save_raw(tmp_path / f"{name}.npz", dict(tiny_arrays, chat_template=value))
        assert_fails(outdir, [tmp_path / f"{name}.npz", out], "checkpoint entry 'chat_template'")


def test_bad_tokenizer_and_dtype(tmp_path, outdir, tiny_arrays, sp_model):
    out = outdir / "m.gguf"
    no_tok = tmp_path / "notok.npz"
    save_raw(no_tok, {k: v for k, v in tiny_arrays.items() if k != "tokenizer"})
    assert_fails(outdir, [no_tok, out], "--tokenizer", "'tokenizer' entry", "--vocab-from")
    run_convert("--synthetic", "tiny", tmp_path / "syn.gguf")
    big = make_checkpoint(default_tiny_config(vocab_size=600), seed=2)
    save_raw(tmp_path / "v600.npz", big)
    assert_fails(outdir, [tmp_path / "v600.npz", out, "--tokenizer", sp_model], "512 tokens", "vocab_size is 600")
    assert_fails(outdir, [tmp_path / "v600.npz", out, "--vocab-from", tmp_path / "syn.gguf"], "vocab_size is 600")
    (tmp_path / "junk.model").write_bytes(b"\xff\xff\xff")
    assert_fails(outdir, [no_tok, out, "--tokenizer", tmp_path / "junk.model"], "junk.model", "SentencePiece")
    # bfloat16 arrays (|V2) need the dtype declared.
    bf = tmp_path / "bf.npz"
    save_checkpoint(str(bf), tiny_arrays, dtype="bfloat16")
    with np.load(bf) as z:
        arrays = {k: z[k] for k in z.files}
    cfg = json.loads(str(arrays["config"]))
    del cfg["dtype"]
    save_raw(tmp_path / "bf-nodtype.npz", arrays, config=cfg)
    assert_fails(outdir, [tmp_path / "bf-nodtype.npz", out], "|V2", "bfloat16")
    run_convert(tmp_path / "bf-nodtype.npz", out, "--input-dtype", "bfloat16")
    validate(out)
    os.remove(out)
    assert_fails(outdir, [bf, out, "--input-dtype", "float16"], "declared")
