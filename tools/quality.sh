#!/usr/bin/env bash
# Perplexity and KL divergence of the shipped model's quantizations against its f32 conversion,
# on the whole held-out text (llama-perplexity's method, n_ctx 256): the numbers of
# docs/QUALITY.md. Not run in CI (a few minutes on 2 cores).
# Usage: bash tools/quality.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
cargo build --quiet --bin spark --bin spark-convert
out=target/quality
mkdir -p "$out"
bin=target/debug
$bin/spark-convert models/spark-shakespeare.npz "$out/f32.gguf" --outtype f32 --force --quiet
for q in Q8_0 Q4_K_M; do
    $bin/spark quantize "$out/f32.gguf" "$out/$q.gguf" "$q" --quiet
done
ls -l "$out"/*.gguf
echo "== f32 (writes the KLD base)"
$bin/spark perplexity -m "$out/f32.gguf" -f models/heldout.txt -c 256 -t "$threads" \
    --kl-divergence-base "$out/f32.kld" --spark-stats
for q in Q8_0 Q4_K_M; do
    echo "== $q"
    $bin/spark perplexity -m "$out/$q.gguf" -c 256 -t "$threads" \
        --kl-divergence-base "$out/f32.kld" --kl-divergence
done
echo "== f32, dense stock-op graph (no Spark kernels)"
$bin/spark perplexity -m "$out/f32.gguf" -f models/heldout.txt -c 256 -t "$threads" --dense
