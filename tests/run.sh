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
echo "== cargo test"
cargo test --workspace --quiet
echo "== pytest"
"$SPARK_PYTHON" -m pytest -q tests
