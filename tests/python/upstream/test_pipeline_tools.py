"""More of llama.cpp's pipeline tools on the shipped Spark model, as users run them (README,
"Upstream llama.cpp"): llama-batched-bench (parallel sequences), llama-imatrix feeding
llama-quantize --imatrix, llama-gguf-split (split, merge) and llama-tokenize.

Independent sides: the importance matrix is checked against the float64 reference's activations
(tests/reference/spark_ref.py) on the same tokens, the tokenizer against SentencePiece itself
running the tokenizer model stored in the checkpoint (the converter copies its pieces into the
GGUF; llama.cpp tokenizes with its own SPM implementation).

What imatrix sees of a Spark layer (docs/QUALITY.md, "Importance matrix"): llama-imatrix
collects the inputs of GGML_OP_MUL_MAT / MUL_MAT_ID nodes whose weight is named blk.*. The
predictor K1 (ffn_gate) and attention's Q, K, V and output projections are stock mul_mats on
both paths. K2 (ffn_up) is a mul_mat only on the dense stock-op graph (no plugin); with the plugin
it is read inside the spark_ffn_* custom ops and gets no entry. V (ffn_down_t, neuron-major) is
applied with ggml_out_prod on the dense graph and inside the custom ops with the plugin: no entry
either way."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from upstream_helpers import (CFG, HELDOUT, MODEL_NPZ, TARGET_KEEP, THREADS, Result,
                              assert_stats_table, llama_completion, llama_perplexity,
                              parse_stats, run, run_until_complete, tool, tool_env)

N_LAYERS = CFG["n_layers"]
R_F = CFG["ffn_r"]
D = CFG["d_model"]


# ---------------------------------------------------------------------------------------------
# llama-batched-bench: parallel sequences through the sparse kernels

PP, TG, NPL = 16, 4, (1, 2, 4)
WARMUP_TOKENS = 16  # batched-bench decodes 16 random tokens (no outputs) before the first row


def expected_row(pl: int, shared: bool, unified: bool) -> tuple[int, int, int]:
    """(N_KV, tokens decoded, output rows) of one batched-bench row: without -pps every sequence
    has its own PP-token prompt (last token an output) and then TG tokens; with -pps one prompt
    is decoded and copied to the other sequences, which in a non-unified KV cache (one stream per
    sequence) takes one extra dummy token (an output) to apply the copy."""
    if not shared:
        return pl * (PP + TG), pl * (PP + TG), pl + pl * TG
    dummy = 0 if unified else 1
    return (PP if unified else pl * PP) + pl * TG, PP + dummy + pl * TG, 1 + dummy + pl * TG


def batched_bench(model, with_plugin: bool, *extra) -> tuple[list, Result]:
    """llama-batched-bench -npp PP -ntg TG -npl 1,2,4; returns its rows (markdown cells as ints
    and floats, or the JSONL records) and the run. A capture without all rows is run again."""
    jsonl = "jsonl" in extra

    def rows(res: Result) -> list:
        if jsonl:
            return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        out = []
        for line in res.stdout.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 10 and cells[0].isdigit():
                out.append([int(c) for c in cells[:4]] + [float(c) for c in cells[4:]])
        return out

    cmd = [tool("llama-batched-bench"), "-m", model, "-c", "512", "-npp", PP, "-ntg", TG,
           "-npl", ",".join(map(str, NPL)), "-t", THREADS, *extra]
    res = run_until_complete(cmd, lambda r: len(rows(r)) == len(NPL), env=tool_env(with_plugin),
                             timeout=300)
    return rows(res), res


def assert_tokens_through_every_layer(res: Result, want_tokens: int, want_outputs: int):
    """The plugin's table: every layer's sparse FFN and attention ran, on every token decoded
    (the last layer's FFN on the output rows only)."""
    stats = assert_stats_table(res.stderr, N_LAYERS, TARGET_KEEP, tol=0.02, explain=res.explain)
    got = [stats.rows[layer].tokens for layer in range(N_LAYERS)]
    want = [want_tokens] * (N_LAYERS - 1) + [want_outputs]
    assert got == want, res.explain(
        f"spark-stats ffn_tokens per layer {got}, want {want}: the warm-up's {WARMUP_TOKENS} "
        f"tokens plus every row's prompt and generated tokens (last layer: the output rows)")
    return stats


def test_batched_bench_rows_and_sparse_kernels(shipped_f32):
    rows, res = batched_bench(shipped_f32, True)
    assert len(rows) == len(NPL), res.explain(f"{len(rows)} table rows, want {len(NPL)}:\n"
                                              f"{res.stdout}")
    for row, pl in zip(rows, NPL):
        n_kv = expected_row(pl, shared=False, unified=False)[0]
        assert row[:4] == [PP, TG, pl, n_kv], res.explain(
            f"row {row}: want PP {PP}, TG {TG}, B {pl}, N_KV {n_kv}\n{res.stdout}")
        # S_PP, S_TG, S (the times are printed to 1 ms and may round to 0 on a fast machine)
        assert min(row[5], row[7], row[9]) > 0, res.explain(f"row {row}: a speed <= 0")
    tokens = WARMUP_TOKENS + sum(expected_row(pl, False, False)[1] for pl in NPL)
    outputs = sum(expected_row(pl, False, False)[2] for pl in NPL)
    stats = assert_tokens_through_every_layer(res, tokens, outputs)
    print("\n" + res.stdout + "\n".join(stats.lines))


@pytest.mark.parametrize("unified", [False, True], ids=["kv-per-sequence", "kv-unified"])
def test_batched_bench_shared_prompt_jsonl(shipped_f32, unified):
    """-pps (one prompt copied to every sequence: llama_memory_seq_cp across the untransposed V
    cache of patch 0004 when each sequence has its own stream) and JSONL records."""
    rows, res = batched_bench(shipped_f32, True, "-pps", "--output-format", "jsonl",
                              *(["-kvu"] if unified else []))
    assert len(rows) == len(NPL), res.explain(f"{len(rows)} records, want {len(NPL)}:\n"
                                              f"{res.stdout}")
    for rec, pl in zip(rows, NPL):
        n_kv = expected_row(pl, True, unified)[0]
        got = {k: rec[k] for k in ("pp", "tg", "pl", "n_kv", "is_pp_shared", "n_threads")}
        want = {"pp": PP, "tg": TG, "pl": pl, "n_kv": n_kv, "is_pp_shared": 1,
                "n_threads": int(THREADS)}
        assert got == want, res.explain(f"record {rec}: want {want}")
        assert rec["speed_pp"] > 0 and rec["speed_tg"] > 0, res.explain(f"record {rec}")
    tokens = WARMUP_TOKENS + sum(expected_row(pl, True, unified)[1] for pl in NPL)
    outputs = sum(expected_row(pl, True, unified)[2] for pl in NPL)
    assert_tokens_through_every_layer(res, tokens, outputs)


# ---------------------------------------------------------------------------------------------
# llama-imatrix and llama-quantize --imatrix

IMATRIX_CHUNKS = 2  # chunks of 256 tokens of the held-out text
N_CTX = 256


def expected_entries(with_plugin: bool) -> dict:
    """{entry name: columns}: the mul_mat weights of the graph that runs (module docstring)."""
    kinds = {"attn_q": D, "attn_k": D, "attn_v": D,
             "attn_output": CFG["n_heads"] * CFG["head_dim"], "ffn_gate": R_F}
    if not with_plugin:
        kinds["ffn_up"] = D - R_F
    return {f"blk.{il}.{k}.weight": n for il in range(N_LAYERS) for k, n in kinds.items()}


def read_imatrix(path) -> dict:
    """{entry name: (count, in_sum2 [columns] float64)} of an imatrix GGUF (llama-imatrix's
    default format: per entry `NAME.in_sum2` and `NAME.counts`)."""
    r = GGUFReader(path)
    t = {x.name: np.array(x.data, dtype=np.float64).ravel() for x in r.tensors}
    names = [n[: -len(".in_sum2")] for n in t if n.endswith(".in_sum2")]
    return {n: (t[n + ".counts"], t[n + ".in_sum2"]) for n in names}


@pytest.fixture(scope="module")
def imatrix(shipped_f32, upstream_models):
    """with_plugin -> (imatrix path, Result) of llama-imatrix on the first IMATRIX_CHUNKS chunks
    of the held-out text (n_ctx 256), made on demand."""
    made = {}

    def get(with_plugin: bool):
        if with_plugin not in made:
            out = upstream_models / f"imatrix-{'plugin' if with_plugin else 'dense'}.gguf"
            res = run([tool("llama-imatrix"), "-m", shipped_f32, "-f", HELDOUT, "-c", N_CTX,
                       "--chunks", IMATRIX_CHUNKS, "-t", THREADS, "--no-ppl", "-o", out],
                      env=tool_env(with_plugin), timeout=300)
            assert out.is_file(), res.explain(f"{out} was not written")
            made[with_plugin] = out, res
        return made[with_plugin]

    return get


@pytest.fixture(scope="module")
def reference_mean_squares() -> dict:
    """{entry name: float64 [columns]}: the mean over the imatrix's tokens of the squared input
    of each weight, from the float64 reference's forward pass on those tokens (tokenized by
    SentencePiece; each chunk starts with BOS as llama-imatrix makes it). The reference's own
    functions are wrapped to record their inputs: rms_norm's first call per layer is the
    attention input (Q, K, V), spark_attention's result the attention output projection's input,
    spark_ffn_dense's h the FFN input (K1: h[:r_f], K2: h[r_f:])."""
    import sentencepiece as spm
    import spark_checkpoint
    import spark_ref

    cfg, weights = spark_checkpoint.load_checkpoint(str(MODEL_NPZ))
    sp = spm.SentencePieceProcessor(model_proto=np.load(MODEL_NPZ)["tokenizer"].tobytes())
    tokens = [sp.bos_id()] + sp.encode(HELDOUT.read_text(encoding="utf-8"))
    sums: dict = {}
    state = {"norm_calls": 0, "layer": 0}

    def add(names, x):
        x = np.asarray(x, dtype=np.float64)
        x = x.reshape(-1, x.shape[-1])
        for name in names:
            n, s = sums.get(name, (0, 0.0))
            sums[name] = (n + x.shape[0], s + (x * x).sum(axis=0))

    rms_norm = spark_ref.rms_norm
    attention = spark_ref.spark_attention
    ffn = spark_ref.spark_ffn_dense

    def rms_norm_hook(x, scale, eps):
        out = rms_norm(x, scale, eps)
        i = state["norm_calls"]
        state["norm_calls"] += 1
        if i % 4 == 0 and i // 4 < cfg["n_layers"]:  # pre-attention norm of layer i // 4
            state["layer"] = i // 4
            add([f"blk.{i // 4}.{k}.weight" for k in ("attn_q", "attn_k", "attn_v")], out)
        return out

    def attention_hook(q, k, v, layer, c, stats=None):
        o = attention(q, k, v, layer, c, stats)
        add([f"blk.{layer}.attn_output.weight"], o.reshape(o.shape[0], -1))
        return o

    def ffn_hook(h, k1, k2, v, ffn_k):
        il = state["layer"]
        add([f"blk.{il}.ffn_gate.weight"], h[None, : k1.shape[0]])
        add([f"blk.{il}.ffn_up.weight"], h[None, k1.shape[0]:])
        return ffn(h, k1, k2, v, ffn_k)

    try:
        spark_ref.rms_norm = rms_norm_hook
        spark_ref.spark_attention = attention_hook
        spark_ref.spark_ffn_dense = ffn_hook
        for c in range(IMATRIX_CHUNKS):
            chunk = list(tokens[c * N_CTX:(c + 1) * N_CTX])
            chunk[0] = sp.bos_id()
            state["norm_calls"] = 0
            spark_ref.forward(cfg, weights, chunk)
            # the hooks' premise: four norms per layer (pre/post attention, pre/post FFN) + final
            assert state["norm_calls"] == 4 * cfg["n_layers"] + 1, state
    finally:
        spark_ref.rms_norm, spark_ref.spark_attention, spark_ref.spark_ffn_dense = (
            rms_norm, attention, ffn)
    return {name: s / n for name, (n, s) in sums.items()}


@pytest.mark.parametrize("with_plugin", [True, False], ids=["sparse", "dense-graph"])
def test_imatrix_entries_are_the_mul_mat_weights(imatrix, reference_mean_squares, with_plugin):
    path, res = imatrix(with_plugin)
    got = read_imatrix(path)
    want = expected_entries(with_plugin)
    assert sorted(got) == sorted(want), res.explain(
        f"imatrix entries {sorted(got)}\nwant {sorted(want)} (missing: "
        f"{sorted(set(want) - set(got))}, unexpected: {sorted(set(got) - set(want))})")
    n_tokens = IMATRIX_CHUNKS * N_CTX
    for name, (count, sum2) in got.items():
        assert count.tolist() == [n_tokens], f"{name}: counts {count}, want [{n_tokens}]"
        assert sum2.size == want[name], f"{name}: {sum2.size} columns, want {want[name]}"
        # in_sum2 / count is the mean squared input per column: the reference's on the same
        # tokens, to the float error of llama.cpp's f32 weights, f16 KV cache and GELU table
        # (measured: 1e-4 for the FFN inputs, 3e-3 for the attention output)
        ref = reference_mean_squares[name]
        rel = np.abs(sum2 / count[0] - ref) / ref
        assert rel.max() < 1e-2, (f"{name}: mean squared input differs from the float64 "
                                  f"reference by up to {rel.max():.2e} (column {rel.argmax()})")
    if with_plugin:
        assert_stats_table(res.stderr, N_LAYERS, TARGET_KEEP, explain=res.explain)
    else:
        assert not parse_stats(res.stderr).lines, res.explain("spark-stats without the plugin")


KLD_CHUNKS = 2

def kld_stats(res: Result) -> tuple[float, float]:
    """(mean KLD, same top-1 %) of a llama-perplexity --kl-divergence run."""
    text = res.stdout + res.stderr
    mean = re.search(r"Mean\s+KLD:\s*([0-9.]+)", text)
    top1 = re.search(r"Same top p:\s*([0-9.]+)", text)
    assert mean and top1, res.explain("no 'Mean KLD' / 'Same top p' in the output")
    return float(mean.group(1)), float(top1.group(1))


@pytest.fixture(scope="module")
def kld_base(shipped_f32, upstream_models):
    """sparse -> the f32 model's distributions on the first KLD_CHUNKS chunks of the held-out
    text (n_ctx 256), with the plugin (sparse kernels) or without (dense graph)."""
    made = {}

    def get(sparse: bool):
        if sparse not in made:
            out = upstream_models / f"f32-{'sparse' if sparse else 'dense'}.kld"
            res = llama_perplexity(shipped_f32, "-f", HELDOUT, "-c", N_CTX, "--chunks",
                                   KLD_CHUNKS, "--kl-divergence-base", out, with_plugin=sparse)
            assert out.is_file(), res.explain(f"{out} was not written")
            made[sparse] = out
        return made[sparse]

    return get


def quantized_weights(path) -> dict:
    """{tensor name: (type name, data bytes)} of a GGUF's tensors."""
    r = GGUFReader(path)
    return {t.name: (t.tensor_type.name, bytes(t.data)) for t in r.tensors}


def field_value(r: GGUFReader, key: str):
    f = r.fields[key]
    if f.types == [GGUFValueType.STRING]:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]].tolist()[0]


@pytest.mark.parametrize("qtype,with_plugin", [("Q4_K_M", False), ("Q4_K_M", True),
                                               ("IQ4_XS", False)],
                         ids=["Q4_K_M-dense-imatrix", "Q4_K_M-plugin-imatrix",
                              "IQ4_XS-dense-imatrix"])
def test_quantize_uses_the_imatrix_where_it_has_entries(imatrix, kld_base, shipped_f32,
                                                        shipped_quantized, upstream_models,
                                                        qtype, with_plugin):
    """llama-quantize --imatrix changes exactly the tensors the matrix has entries for (their
    quantization is weighted by it), keeps every other tensor byte for byte as the plain
    quantization has it, and records the matrix in the file's metadata. The file works: its
    distributions on the first chunks of the held-out text are close to the f32 model's on the
    path it runs on (the sparse kernels; the dense graph for IQ4_XS)."""
    imat, _ = imatrix(with_plugin)
    entries = read_imatrix(imat)
    out = upstream_models / f"{qtype}-imatrix-{'plugin' if with_plugin else 'dense'}.gguf"
    res = run([tool("llama-quantize"), "--imatrix", imat, shipped_f32, out, qtype, THREADS],
              env=tool_env(False, stats=False))
    plain, weighted = quantized_weights(shipped_quantized(qtype)), quantized_weights(out)
    assert sorted(plain) == sorted(weighted)
    changed = sorted(n for n in plain if plain[n] != weighted[n])
    assert changed == sorted(entries), res.explain(
        f"tensors changed by the imatrix: {changed}\nentries: {sorted(entries)}")
    assert all(plain[n][0] == weighted[n][0] for n in plain), "tensor types differ"
    # the tensors without data, as llama-quantize reports them
    no_data = sorted(re.findall(r"did not find weights for (\S+)", res.stderr + res.stdout))
    quantized = sorted(n for n, (t, _) in weighted.items() if t not in ("F32", "F16"))
    assert no_data == sorted(set(quantized) - set(entries)), res.explain(
        f"llama-quantize found no data for {no_data}")
    r = GGUFReader(out)
    assert field_value(r, "quantize.imatrix.entries_count") == len(entries)
    assert field_value(r, "quantize.imatrix.chunks_count") == IMATRIX_CHUNKS
    types = {re.sub(r"^blk\.\d+\.", "", n): t for n, (t, _) in weighted.items()}
    print(f"\n{qtype} with the {'plugin' if with_plugin else 'dense-graph'} imatrix: "
          f"{len(changed)} tensors weighted, none for {sorted(set(quantized) - set(entries))}\n"
          f"types: {types}")
    if qtype == "IQ4_XS":
        # rows of 128 (K1, K2) fall back to iq4_nl; the sparse kernels take neither (patches/
        # README.md, "Known limits"), so such a file runs on the dense stock-op graph
        assert types["ffn_gate.weight"] == types["ffn_up.weight"] == "IQ4_NL", types
        assert types["ffn_down_t.weight"] == "IQ4_XS", types
    # the file works: close to the f32 model's distributions on the path it runs on
    sparse = qtype != "IQ4_XS"
    kld = llama_perplexity(out, "--kl-divergence-base", kld_base(sparse), "--kl-divergence",
                           with_plugin=sparse)
    mean_kld, top1 = kld_stats(kld)
    print(f"against f32 ({'sparse kernels' if sparse else 'dense graph'}, "
          f"{KLD_CHUNKS} chunks): mean KLD {mean_kld}, same top-1 {top1} %")
    assert mean_kld < 0.05 and top1 > 80, kld.explain(f"mean KLD {mean_kld}, same top-1 {top1} %")
    if sparse:
        assert_stats_table(kld.stderr, N_LAYERS, TARGET_KEEP, tol=0.02, explain=kld.explain)


# ---------------------------------------------------------------------------------------------
# llama-gguf-split: split, merge, load the parts

# the keys llama-gguf-split --merge appends, in its order
SPLIT_KEYS = ("split.no", "split.tensors.count", "split.count")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gguf_split(*args) -> Result:
    return run([tool("llama-gguf-split"), *args], env=tool_env(False, stats=False))


def split_parts(prefix) -> list:
    parts = sorted(prefix.parent.glob(prefix.name + "-*-of-*.gguf"))
    assert parts, f"no split parts {prefix}-*-of-*.gguf"
    return parts


@pytest.fixture(scope="module")
def split_model(shipped_f32, upstream_models):
    """The f32 model split into parts of at most 20 tensors, and merged again."""
    d = upstream_models / "split"
    d.mkdir(exist_ok=True)
    gguf_split("--split", "--split-max-tensors", "20", shipped_f32, d / "spark")
    parts = split_parts(d / "spark")
    merged = d / "merged.gguf"
    gguf_split("--merge", parts[0], merged)
    return parts, merged


def test_gguf_split_merge_round_trip(shipped_f32, split_model, upstream_models):
    """Merging gives back the original tensors and metadata, bit for bit, plus the three split.*
    keys llama-gguf-split's merge always writes (split.no 0, split.tensors.count, split.count 0:
    "not split"); so a merged file split and merged again is bit-identical."""
    parts, merged = split_model
    orig = GGUFReader(shipped_f32)
    n_tensors = len(orig.tensors)
    assert len(parts) == -(-n_tensors // 20), [p.name for p in parts]
    seen = []
    for i, p in enumerate(parts):
        r = GGUFReader(p)
        assert (field_value(r, "split.no"), field_value(r, "split.count"),
                field_value(r, "split.tensors.count")) == (i, len(parts), n_tensors), p
        seen += [t.name for t in r.tensors]
    assert seen == [t.name for t in orig.tensors]

    m = GGUFReader(merged)
    keys = [k for k in m.fields if not k.startswith("GGUF.")]
    orig_keys = [k for k in orig.fields if not k.startswith("GGUF.")]
    assert keys == orig_keys + list(SPLIT_KEYS), keys
    for k in orig_keys:
        a, b = orig.fields[k], m.fields[k]
        assert a.types == b.types and all(
            np.array_equal(a.parts[i], b.parts[i]) for i in a.data), f"metadata {k} differs"
    assert [field_value(m, k) for k in SPLIT_KEYS] == [0, n_tensors, 0]
    for a, b in zip(orig.tensors, m.tensors):
        assert (a.name, a.tensor_type, list(a.shape), int(a.data_offset - orig.data_offset)) == \
               (b.name, b.tensor_type, list(b.shape), int(b.data_offset - m.data_offset)), a.name
    # the whole tensor data section, padding included
    assert shipped_f32.read_bytes()[orig.data_offset:] == merged.read_bytes()[m.data_offset:]

    d = upstream_models / "split-again"
    d.mkdir(exist_ok=True)
    gguf_split("--split", "--split-max-size", "5M", merged, d / "spark")
    again = d / "merged.gguf"
    gguf_split("--merge", split_parts(d / "spark")[0], again)
    assert sha256(again) == sha256(merged), "split + merge of a merged file is not bit-identical"


def test_split_parts_generate_the_same_text(shipped_f32, split_model):
    parts, merged = split_model
    want, res = llama_completion(shipped_f32, "ROMEO:", 24, True)
    assert want.strip(), res.explain("no text from the original model")
    for model in (parts[0], merged):  # the first part loads the others
        text, res = llama_completion(model, "ROMEO:", 24, True)
        assert text == want, res.explain(f"{model.name}: {text!r}, original: {want!r}")
        assert_stats_table(res.stderr, N_LAYERS, TARGET_KEEP, explain=res.explain)


# ---------------------------------------------------------------------------------------------
# llama-tokenize against SentencePiece

TEXTS = {
    "ascii": "ROMEO: But soft, what light through yonder window breaks?",
    "newlines": "First line\nSecond line\n\nAfter a blank line\n",
    "whitespace": "  two leading spaces,\ttab,   three inside, trailing  ",
    "digits": "Act 3, Scene 2: 1599 or 1600? 3.14159",
    "unicode": "café naïve Œuvre — “quoted” ’tis",
    "byte-fallback": "日本語 🙂 \x01\x7f",
    "crlf": "a\r\nb\rc",
}


@pytest.fixture(scope="module")
def sentencepiece():
    """SentencePiece running the tokenizer model stored in the checkpoint (tools/train trained
    it: identity normalization, no dummy prefix, byte fallback, "\\n" a user-defined piece)."""
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=np.load(MODEL_NPZ)["tokenizer"].tobytes())


def llama_tokenize(model, path, *extra) -> tuple[list, Result]:
    """The ids llama-tokenize gives for the file's exact bytes (-f with --no-escape)."""
    cmd = [tool("llama-tokenize"), "-m", model, "-f", path, "--no-escape", "--ids",
           "--log-disable", *extra]
    res = run_until_complete(cmd, lambda r: r.stdout.rstrip().endswith("]"),
                             env=tool_env(False, stats=False))
    try:
        return json.loads(res.stdout.strip()), res
    except json.JSONDecodeError:
        pytest.fail(res.explain(f"--ids output is not a list: {res.stdout!r}"), pytrace=False)


@pytest.mark.parametrize("name", list(TEXTS))
def test_llama_tokenize_matches_sentencepiece(shipped_f32, sentencepiece, tmp_path, name):
    text = TEXTS[name]
    path = tmp_path / "text.txt"
    path.write_bytes(text.encode("utf-8"))
    want = sentencepiece.encode(text)
    if name == "byte-fallback":  # the case must exercise it: pieces <0x00>..<0xFF>
        assert all(sentencepiece.is_byte(i) for i in want[:3]), want
    assert sentencepiece.decode(want) == text
    bos = sentencepiece.bos_id()
    for extra, expect in (((), [bos] + want), (("--no-bos",), want),
                          (("--no-parse-special",), [bos] + want)):
        got, res = llama_tokenize(shipped_f32, path, *extra)
        assert got == expect, res.explain(f"{name} {extra}: llama-tokenize {got}\n"
                                          f"SentencePiece {expect}")


def test_llama_tokenize_special_token_text(shipped_f32, sentencepiece, tmp_path):
    """Text that spells a control piece: SentencePiece encodes it as text, and so does
    llama-tokenize with --no-parse-special; by default llama-tokenize parses it as the token."""
    text = "<bos>ROMEO<eos>"
    path = tmp_path / "special.txt"
    path.write_text(text, encoding="utf-8")
    bos, eos = sentencepiece.bos_id(), sentencepiece.eos_id()
    got, res = llama_tokenize(shipped_f32, path, "--no-parse-special")
    assert got == [bos] + sentencepiece.encode(text), res.stdout
    got, res = llama_tokenize(shipped_f32, path)
    assert got == [bos, bos] + sentencepiece.encode("ROMEO") + [eos], res.stdout


def test_llama_tokenize_heldout_text(shipped_f32, sentencepiece):
    """The whole held-out text (the perplexity tables' 39,302 tokens with BOS)."""
    got, res = llama_tokenize(shipped_f32, HELDOUT)
    want = [sentencepiece.bos_id()] + sentencepiece.encode(HELDOUT.read_text(encoding="utf-8"))
    assert len(got) == len(want) == 39302, (len(got), len(want))
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert first is None, f"first difference at token {first}: {got[first:first + 8]} vs " \
                          f"{want[first:first + 8]}"
