#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust tests, and the Python tests that compare our
# binaries and files with the independent float64 reference and with gguf-py.
# Needs what tools/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPARK_PYTHON="${SPARK_PYTHON:-$PWD/.venv/bin/python}"
export SPARK_BIN_DIR="${SPARK_BIN_DIR:-$PWD/target/debug}"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo build (binaries used by the Python tests)"
cargo build --workspace --quiet
echo "== upstream llama.cpp tools (tools/upstream.sh: the tools on the same llama.cpp build)"
bash tools/upstream.sh --quiet
echo "== llama-cpp-python on that build (tools/python.sh: pinned sdist, headers checked)"
bash tools/python.sh --quiet --no-build
echo "== cargo test"
cargo test --workspace --quiet
echo "== CUDA without a GPU (tools/cuda-tools.sh: NVRTC and nvcc 13.0 from PyPI)"
bash tools/cuda-tools.sh --quiet
# shellcheck source=/dev/null
source target/cuda-tools/env.sh
echo "== ggml-cuda hook compiles (tools/cuda-hook-check.sh: patch 0008, sm_75/80/90)"
bash tools/cuda-hook-check.sh --quiet
echo "== cargo clippy + test -p spark-backend --features cuda (kernels compile through NVRTC)"
cargo clippy -p spark-backend --all-targets --features cuda --quiet -- -D warnings
LD_LIBRARY_PATH="$SPARK_NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test -p spark-backend --features cuda --quiet --lib --test "cuda_*"
echo "== pytest"
"$SPARK_PYTHON" -m pytest -q tests
