#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust tests, and the Python tests that compare our
# binaries and files with the independent float64 reference and with gguf-py.
# Needs what tools/setup.sh installs.
#
# Usage: bash tests/run.sh [--quick]
#   (no option)  everything, as CI runs it.
#   --quick      the inner loop: formatting, lints, the Rust build and tests, and the Python
#                tests that need neither llama.cpp's tools nor CUDA. It leaves out the
#                upstream-tools build (tools/upstream.sh, tools/python.sh), the CUDA tools
#                download (tools/cuda-tools.sh), the CUDA steps (the hook's compile check,
#                clippy and tests with --features cuda) and the Python tests that run
#                llama.cpp's tools: tests/python/upstream, tests/python/gemma3n (Gemma 3n
#                files through llama-completion, -bench, -server, -perplexity with the
#                plugin), tests/python/integration/test_iq_types.py (llama-quantize) and the
#                llama-gguf-hash tests of
#                tests/python/convert/test_manifest.py; the AMX checks (tools/amx-check.sh, with
#                and without --emulate); and the aarch64 steps: the cross build
#                (tools/arm-build.sh), spark-backend's tests under qemu (tools/arm-check.sh)
#                and tests/python/arm. Run the whole suite before pushing.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() {
    echo "usage: bash tests/run.sh [--quick]" >&2
    exit 2
}
quick=0
if [ $# -gt 1 ]; then
    usage
fi
case "${1:-}" in
    "") ;;
    --quick) quick=1 ;;
    *) usage ;;
esac
export SPARK_PYTHON="${SPARK_PYTHON:-$PWD/.venv/bin/python}"
export SPARK_BIN_DIR="${SPARK_BIN_DIR:-$PWD/target/debug}"

# Each stage's wall time: printed when it ends, and all of them at the exit (a failed run too).
stage_names=()
stage_secs=()
stage_name=""
stage_t0=$SECONDS
stage_end() {
    if [ -n "$stage_name" ]; then
        stage_names+=("$stage_name")
        stage_secs+=("$((SECONDS - stage_t0))")
        echo "   ($((SECONDS - stage_t0)) s)"
    fi
    stage_name=""
}
stage() {
    stage_end
    stage_name=$1
    stage_t0=$SECONDS
    echo "== $1"
}
stage_times() {
    local rc=$? i
    stage_end
    echo "== stage times ($([ "$rc" = 0 ] && echo passed || echo "failed: exit $rc"))"
    for i in "${!stage_names[@]}"; do
        printf '%6d s  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"
    done
    printf '%6d s  total\n' "$SECONDS"
}
trap stage_times EXIT

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
stage "cargo build (binaries used by the Python tests)"
cargo build --workspace --quiet
if [ "$quick" = 0 ]; then
    stage "upstream llama.cpp tools (tools/upstream.sh: the tools on the same llama.cpp build)"
    bash tools/upstream.sh --quiet
    stage "llama-cpp-python on that build (tools/python.sh: pinned sdist, headers checked)"
    bash tools/python.sh --quiet --no-build
    stage "AMX products against plain ones (tools/amx-check.sh: this build's on AMX CPUs; --emulate: ggml's AMX code on software tiles)"
    bash tools/amx-check.sh --quiet
    bash tools/amx-check.sh --emulate --quiet
fi
# The aarch64 steps cross-build on x86-64 hosts; on an ARM host the native build is the ARM build.
arm=0
[ "$quick" = 0 ] && [ "$(uname -m)" = x86_64 ] && arm=1
if [ "$arm" = 1 ]; then
    stage "aarch64 cross build (tools/arm-build.sh: the workspace, llama.cpp, llama-completion, the plugin)"
    bash tools/arm-build.sh --quiet
fi
stage "cargo test"
cargo test --workspace --quiet
if [ "$quick" = 1 ]; then
    stage "pytest (--quick: without the tests of llama.cpp's tools)"
    "$SPARK_PYTHON" -m pytest -q tests \
        --ignore=tests/python/upstream \
        --ignore=tests/python/arm \
        --ignore=tests/python/gemma3n \
        --ignore=tests/python/integration/test_iq_types.py \
        --deselect=tests/python/convert/test_manifest.py::test_manifest_is_what_llama_gguf_hash_prints_and_checks \
        --deselect=tests/python/convert/test_manifest.py::test_a_corrupted_copy_fails_the_check_naming_the_tensor
    stage_end
    echo "== --quick: left out the upstream tools, the CUDA steps, the aarch64 steps and their tests"
    exit 0
fi
stage "CUDA without a GPU (tools/cuda-tools.sh: NVRTC and nvcc 13.0 from PyPI)"
bash tools/cuda-tools.sh --quiet
# shellcheck source=/dev/null
source target/cuda-tools/env.sh
stage "ggml-cuda hook compiles (tools/cuda-hook-check.sh: patch 0008, sm_75/80/90)"
bash tools/cuda-hook-check.sh --quiet
stage "cargo clippy + test -p spark-backend --features cuda (kernels compile through NVRTC)"
cargo clippy -p spark-backend --all-targets --features cuda --quiet -- -D warnings
LD_LIBRARY_PATH="$SPARK_NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test -p spark-backend --features cuda --quiet --lib --test "cuda_*"
if [ "$arm" = 1 ]; then
    stage "aarch64 under qemu (tools/arm-check.sh: spark-backend's tests, the kernel-family ones at cortex-a57 only)"
    bash tools/arm-check.sh --cpus --kernels --quiet
fi
stage "pytest (every Python test; tests/python/arm: the aarch64 build end to end under qemu)"
"$SPARK_PYTHON" -m pytest -q --durations=25 tests
