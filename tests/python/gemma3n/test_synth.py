"""tools/gemma3n-synth.py: its `tiny` Gemma 3n, f32 and q8_0, has every key and tensor
upstream llama.cpp's loader reads (checked here against src/models/gemma3n.cpp's
load_arch_tensors, written out below, not against the tool's own list), and stock upstream tools
(no plugin) run it: llama-completion generates 16 greedy tokens, the same twice; llama-perplexity
gives a finite figure. A bad preset or an existing output fails without writing a file."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gguf

from gemma3n_helpers import (LAUREL_RANK, N_ALTUP, N_EMBD_ALTUP, N_LAYER_KV_FROM_START,
                             N_LAYER_SPARSE, STD_MUL, STD_MUL_KEEP, synth, uh)

ARCH = "gemma3n"
PROMPT = "ROMEO:"


def kv(reader: gguf.GGUFReader, key: str):
    f = reader.get_field(key)
    assert f is not None, f"key {key} is missing"
    return f.contents()


def loader_tensors(n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab) -> dict:
    """name -> ggml shape, as load_arch_tensors creates them (tied output: no output.weight)."""
    t = {
        "token_embd.weight": (n_embd, n_vocab),
        "altup_proj.weight": (n_embd, n_embd, N_ALTUP - 1),
        "altup_unembd_proj.weight": (n_embd, n_embd, N_ALTUP - 1),
        "per_layer_token_embd.weight": (N_EMBD_ALTUP * n_layer, n_vocab),
        "per_layer_model_proj.weight": (n_embd, N_EMBD_ALTUP * n_layer),
        "per_layer_proj_norm.weight": (N_EMBD_ALTUP,),
        "output_norm.weight": (n_embd,),
    }
    for i in range(n_layer):
        b = f"blk.{i}."
        t.update({
            b + "attn_norm.weight": (n_embd,),
            b + "attn_q.weight": (n_embd, head_dim * n_head),
            b + "attn_k.weight": (n_embd, head_dim * n_head_kv),
            b + "attn_v.weight": (n_embd, head_dim * n_head_kv),
            b + "attn_output.weight": (head_dim * n_head, n_embd),
            b + "attn_q_norm.weight": (head_dim,),
            b + "attn_k_norm.weight": (head_dim,),
            b + "post_attention_norm.weight": (n_embd,),
            b + "ffn_norm.weight": (n_embd,),
            b + "ffn_gate.weight": (n_embd, n_ff),
            b + "ffn_up.weight": (n_embd, n_ff),
            b + "ffn_down.weight": (n_ff, n_embd),
            b + "post_ffw_norm.weight": (n_embd,),
            b + "inp_gate.weight": (n_embd, N_EMBD_ALTUP),
            b + "proj.weight": (N_EMBD_ALTUP, n_embd),
            b + "post_norm.weight": (n_embd,),
            b + "altup_correct_coef.weight": (N_ALTUP, N_ALTUP),
            b + "altup_correct_scale.weight": (n_embd,),
            b + "altup_predict_coef.weight": (N_ALTUP, N_ALTUP * N_ALTUP),
            b + "altup_router.weight": (n_embd, N_ALTUP),
            b + "altup_router_norm.weight": (n_embd,),
            b + "laurel_l.weight": (n_embd, LAUREL_RANK),
            b + "laurel_r.weight": (LAUREL_RANK, n_embd),
            b + "laurel_post_norm.weight": (n_embd,),
        })
    return t


# the converter's type rule: 1-D tensors, norms and the altup coefficients F32, the rest --outtype
F32_ALWAYS = ("altup_correct_coef.weight", "altup_predict_coef.weight")


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_keys_and_tensors_are_what_the_loader_reads(tiny, outtype):
    r = gguf.GGUFReader(tiny[outtype])
    assert kv(r, "general.architecture") == ARCH
    n_layer = kv(r, f"{ARCH}.block_count")
    n_embd = kv(r, f"{ARCH}.embedding_length")
    n_ff = kv(r, f"{ARCH}.feed_forward_length")
    assert isinstance(n_ff, list) and len(n_ff) == n_layer and len(set(n_ff)) == 1, n_ff
    n_head = kv(r, f"{ARCH}.attention.head_count")
    n_head_kv = kv(r, f"{ARCH}.attention.head_count_kv")
    head_dim = kv(r, f"{ARCH}.attention.key_length")
    assert kv(r, f"{ARCH}.attention.value_length") == head_dim
    tokens = kv(r, "tokenizer.ggml.tokens")
    n_vocab = len(tokens)
    # a tiny model with sparse, dense and KV-sharing layers: more than n_layer_kv_from_start
    assert n_layer > N_LAYER_KV_FROM_START > N_LAYER_SPARSE

    # hyperparameters llama.cpp reads (generic and load_arch_hparams), and the converter's rest
    for key in ("context_length", "rope.freq_base", "rope.freq_base_swa",
                "attention.layer_norm_rms_epsilon", "attention.sliding_window",
                "final_logit_softcapping"):
        assert kv(r, f"{ARCH}.{key}") > 0, key
    swa = kv(r, f"{ARCH}.attention.sliding_window_pattern")
    assert swa == [(i + 1) % 5 != 0 for i in range(n_layer)], swa
    assert kv(r, f"{ARCH}.altup.active_idx") == 0
    assert kv(r, f"{ARCH}.altup.num_inputs") == N_ALTUP
    assert kv(r, f"{ARCH}.embedding_length_per_layer_input") == N_EMBD_ALTUP
    assert kv(r, f"{ARCH}.attention.shared_kv_layers") == n_layer - N_LAYER_KV_FROM_START
    scale = kv(r, f"{ARCH}.activation_sparsity_scale")
    assert np.allclose(scale[:N_LAYER_SPARSE], STD_MUL)
    assert all(s == -math.inf for s in scale[N_LAYER_SPARSE:]) and len(scale) == n_layer
    # tokenizer: SentencePiece ("llama"), Gemma's special ids, the 256 byte pieces
    assert kv(r, "tokenizer.ggml.model") == "llama"
    assert [kv(r, f"tokenizer.ggml.{k}_token_id") for k in ("padding", "eos", "bos", "unknown")] \
        == [0, 1, 2, 3]
    assert tokens[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert all(f"<0x{b:02X}>" in tokens for b in range(256))
    assert len(set(tokens)) == n_vocab
    assert kv(r, "tokenizer.ggml.add_bos_token") is True
    assert len(kv(r, "tokenizer.ggml.scores")) == len(kv(r, "tokenizer.ggml.token_type")) == n_vocab

    want = loader_tensors(n_layer, n_embd, n_ff[0], n_head, n_head_kv, head_dim, n_vocab)
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert sorted(set(want) - set(got)) == [], "missing tensors"
    assert sorted(set(got) - set(want)) == [], "tensors the loader does not take"
    bad = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not bad, f"shapes (got, want): {bad}"
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    for t in r.tensors:
        f32 = len(t.shape) == 1 or t.name.endswith(F32_ALWAYS)
        want_type = gguf.GGMLQuantizationType.F32 if f32 else qtype
        assert t.tensor_type == want_type, (t.name, t.tensor_type.name)
    assert kv(r, "general.file_type") == {"f32": 0, "q8_0": 7}[outtype]


def test_sparse_layer_gate_preactivations_are_gaussian(tiny):
    """The statistical top-k (mean + 1.645 std) of layer 0 keeps ~5 % on a unit-RMS input."""
    r = gguf.GGUFReader(tiny["f32"])
    gate = next(t for t in r.tensors if t.name == "blk.0.ffn_gate.weight")
    w = np.asarray(gate.data, dtype=np.float64)  # (n_ff, n_embd)
    x = np.random.default_rng(0).standard_normal((64, w.shape[1]))
    g = x @ w.T
    cut = g.mean(axis=1, keepdims=True) + STD_MUL * g.std(axis=1, ddof=1, keepdims=True)
    keep = (g > cut).mean()
    assert abs(keep - STD_MUL_KEEP) < 0.02, keep
    assert 0.8 < g.std() < 1.2, g.std()


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_stock_llama_completion_generates_deterministically(tiny, outtype):
    texts = [uh.llama_completion(tiny[outtype], PROMPT, 16, False, stats=False)[0]
             for _ in range(2)]
    assert texts[0] == texts[1], texts
    assert texts[0].strip(), f"empty text: {texts[0]!r}"
    print(f"\n{outtype}: {PROMPT!r} -> {texts[0]!r}")


def test_stock_llama_perplexity_is_finite(tiny, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(uh.HELDOUT.read_text()[:6000])
    res = uh.llama_perplexity(tiny["f32"], "-f", text, "-c", "128", "--chunks", "2",
                              with_plugin=False)
    ppl = float(uh.final_ppl(res))
    print(f"\ntiny f32: PPL {ppl}")
    assert math.isfinite(ppl) and ppl > 1, ppl


def test_same_seed_same_file_other_seed_another(tiny, tmp_path):
    again, other = tmp_path / "again.gguf", tmp_path / "other.gguf"
    synth("tiny", again, "--outtype", "q8_0", "--seed", 1, "--quiet")
    synth("tiny", other, "--outtype", "q8_0", "--seed", 2, "--quiet")
    assert again.read_bytes() == tiny["q8_0"].read_bytes()
    assert other.read_bytes() != again.read_bytes()


def test_bad_preset_fails_naming_it_and_writes_nothing(tmp_path):
    out = tmp_path / "x.gguf"
    proc = synth("e3b", out, check=False)
    assert proc.returncode == 2, proc
    assert "e3b" in proc.stderr and "tiny" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "x.gguf"
    out.write_bytes(b"keep")
    proc = synth("tiny", out, "--quiet", check=False)
    assert proc.returncode == 1 and "--force" in proc.stderr, proc
    assert out.read_bytes() == b"keep" and sorted(tmp_path.iterdir()) == [out]


def test_ceiling_table():
    proc = synth("--ceiling")
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| e2b", "| e4b"))]
    assert len(rows) == 4, proc.stdout
    for row in rows:
        ceiling = float(row.split("|")[-2].strip().rstrip("x"))
        assert 1.05 < ceiling < 1.5, row


def test_tiny_calm_is_tiny_with_branch_post_norms_of_a_tenth(tiny, calm, tiny_meta):
    """tiny-calm (the fixture of the distance tests) is tiny with each layer's four branch
    post-norms (attention, FFN, per-layer input, laurel) scaled by 0.1, every other tensor the
    same values: the same stream of each tensor, SeedSequence([seed, crc32(name)])."""
    a, b = gguf.GGUFReader(tiny["f32"]), gguf.GGUFReader(calm["f32"])
    calm_tensors = {t.name: t for t in b.tensors}
    scaled = set()
    for t in a.tensors:
        x, y = np.asarray(t.data), np.asarray(calm_tensors.pop(t.name).data)
        if not np.array_equal(x, y):
            np.testing.assert_allclose(y, np.float32(0.1) * x, rtol=1e-6, err_msg=t.name)
            scaled.add(t.name)
    assert not calm_tensors, f"tensors only in tiny-calm: {sorted(calm_tensors)}"
    want = {f"blk.{il}.{n}.weight" for il in range(tiny_meta["n_layer"])
            for n in ("post_attention_norm", "post_ffw_norm", "post_norm", "laurel_post_norm")}
    assert scaled == want, sorted(scaled ^ want)
