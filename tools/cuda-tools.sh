#!/usr/bin/env bash
# Installs the CUDA 13.0 compilers from PyPI into target/cuda-tools (no GPU, no driver, no apt):
# NVRTC (compiles the Spark kernels: the same library the plugin loads at run time), and nvcc
# with the runtime, CCCL and cuBLAS headers (compiles ggml-cuda's hooked source file, patch
# 0008). CUDA 13.0 is what the lent GPU machines run (driver 580); its NVRTC still targets
# sm_75 (Turing, the paper's T4) up to sm_90 (Hopper).
#
# Prints nothing but errors with --quiet. Idempotent: a second run checks and returns.
# Afterwards `source target/cuda-tools/env.sh` sets
#   SPARK_CUDA_TOOLS   the install root,
#   SPARK_NVRTC_LIB    the directory holding libnvrtc.so.13 (put on LD_LIBRARY_PATH for tests),
#   SPARK_NVCC         the nvcc binary,
#   SPARK_CUDA_TOOLKIT a toolkit root of symlinks that CMake's CUDA support accepts
#                      (-DCUDAToolkit_ROOT, -DCMAKE_CUDA_COMPILER=$SPARK_CUDA_TOOLKIT/bin/nvcc;
#                      link with LIBRARY_PATH=$SPARK_CUDA_TOOLKIT/lib:$SPARK_CUDA_TOOLKIT/lib/stubs).
set -euo pipefail
cd "$(dirname "$0")/.."
quiet=0
[ "${1:-}" = "--quiet" ] && quiet=1
say() { [ "$quiet" = 1 ] || echo "cuda-tools: $*"; }

root="$PWD/target/cuda-tools"
# One pinned set; change the versions together.
pins=(
    nvidia-cuda-nvrtc==13.0.88
    nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-cublas==13.0.2.14
)
stamp="$root/.installed"
want="$(printf '%s\n' "${pins[@]}")"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing ${pins[*]} into target/cuda-tools (pip, from PyPI)"
    rm -rf "$root"
    mkdir -p "$root"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps --target "$root/py" "${pins[@]}"
    printf '%s\n' "$want" >"$stamp"
fi

cu="$root/py/nvidia/cu13"
nvrtc_lib="$(dirname "$(ls "$cu"/lib/libnvrtc.so.13* 2>/dev/null | head -1)")"
nvcc="$cu/bin/nvcc"
[ -n "$nvrtc_lib" ] && [ -d "$nvrtc_lib" ] || { echo "cuda-tools: libnvrtc.so.13 missing under $cu/lib" >&2; exit 1; }
[ -x "$nvcc" ] || { echo "cuda-tools: nvcc missing at $nvcc" >&2; exit 1; }
# libnvrtc.so (unversioned) is what cudarc's loader asks for first; the wheel ships only .so.13.
[ -e "$nvrtc_lib/libnvrtc.so" ] || ln -s "$(basename "$(ls "$nvrtc_lib"/libnvrtc.so.13* | head -1)")" "$nvrtc_lib/libnvrtc.so"
# The wheels lack what CMake's CUDA support looks for in a toolkit root: unversioned libcudart
# and libcublas(Lt) links (FindCUDAToolkit), libcuda.so (CUDA::cuda_driver: a stub with the
# driver's soname, linked against and never loaded: the GPU machine's driver provides the real
# one), and nvcc links its compiler check against $TOP/lib64 (LIBRARY_PATH instead). A root of
# symlinks provides them without touching the wheels.
cu_root=$(cd "$(dirname "$nvcc")/.." && pwd)
tk=$root/toolkit
mkdir -p "$tk/lib/stubs"
for d in bin include nvvm; do ln -sfn "$cu_root/$d" "$tk/$d"; done
for f in "$cu_root"/lib/*; do ln -sfn "$f" "$tk/lib/$(basename "$f")"; done
ln -sfn libcudart.so.13 "$tk/lib/libcudart.so"
ln -sfn libcublas.so.13 "$tk/lib/libcublas.so"
ln -sfn libcublasLt.so.13 "$tk/lib/libcublasLt.so"
if [ ! -f "$tk/lib/stubs/libcuda.so" ]; then
    echo 'void cuInit(void) {}' | cc -shared -fPIC -Wl,-soname,libcuda.so.1 -x c - -o "$tk/lib/stubs/libcuda.so"
fi
cat >"$root/env.sh" <<ENV
export SPARK_CUDA_TOOLS="$root"
export SPARK_NVRTC_LIB="$nvrtc_lib"
export SPARK_NVCC="$nvcc"
export SPARK_CUDA_TOOLKIT="$tk"
ENV
say "ready: $("$nvcc" --version | tail -2 | head -1)"
