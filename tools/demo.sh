#!/usr/bin/env bash
# The demo: on a fresh machine, install what building needs (tools/setup.sh --build: cmake,
# libclang-dev, git; nothing of the test suite's), build, convert the shipped Spark model
# (models/spark-shakespeare.npz, trained by tools/train/) to GGUF, and generate text with the
# sparse kernels, printing tokens/s and the measured sparsity per layer.
# Usage: bash tools/demo.sh [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt="${1:-ROMEO:
}"

bash tools/setup.sh --build
echo "demo: building (the first build compiles llama.cpp, ~5 min on 2 cores)"
cargo build --quiet --bin spark --bin spark-convert

out=target/demo
mkdir -p "$out"
target/debug/spark-convert models/spark-shakespeare.npz "$out/spark-shakespeare-f32.gguf" \
    --outtype f32 --force
target/debug/spark run -m "$out/spark-shakespeare-f32.gguf" -p "$prompt" -n 160 \
    --temp 0.8 --top-k 40 --seed 7 --spark-stats
