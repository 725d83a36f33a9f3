#!/usr/bin/env bash
# Compile check, without a GPU, of the llama.cpp series' ggml-cuda changes (patch 0008, the hook
# that runs GGML_OP_CUSTOM nodes through a plugin's CUDA launcher).
#
# What it does:
#   1. nvcc from PyPI (tools/cuda-tools.sh: CUDA 13.0 with runtime, CCCL, cuBLAS headers);
#   2. the patched llama.cpp tree of tools/llama-tree.sh (the pinned crate's sources, the
#      project's new files, the series), in target/cuda-hook-check/tree (independent of any
#      cargo build);
#   3. ggml's own CMake configures that tree with -DGGML_CUDA=ON (and the options
#      tools/gpu-check.sh builds with on the GPU machine), against the PyPI toolkit, so the
#      include paths, defines and flags are exactly ggml-cuda/CMakeLists.txt's; warnings are
#      errors (-DGGML_FATAL_WARNINGS=ON: nvcc -Werror all-warnings);
#   4. builds, with that build system, the object of every ggml/src/ggml-cuda/*.cu file a patch
#      touches (ggml-cuda.cu) for sm_75, sm_80 and sm_90 (Release, i.e. -DNDEBUG), and once
#      more for sm_75 in a Debug configuration (the #ifndef NDEBUG code);
#   5. compiles ggml/include/ggml-cuda.h as C and C++ with a launcher and a registration
#      function of the signatures the plugin implements and calls.
# Exits non-zero if anything fails to compile. Nothing is linked and nothing runs on a GPU.
# Wall time on the 2-core dev machine: about 1 min the first time, ~45 s afterwards.
#
# Usage: bash tools/cuda-hook-check.sh [--quiet]
#   --quiet        errors only
# It checks the series in patches/llama.cpp as the working tree has it (committed or not).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

quiet=0
patch_dir=$root/patches/llama.cpp
while [ $# -gt 0 ]; do
    case "$1" in
        --quiet) quiet=1 ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "cuda-hook-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
say() { if [ "$quiet" = 0 ]; then echo "cuda-hook-check: $*"; fi; }
die() { echo "cuda-hook-check: error: $*" >&2; exit 1; }
start=$SECONDS

work=$root/target/cuda-hook-check
mkdir -p "$work"
log=$work/last.log
: >"$log"
# run LABEL CMD...: output to the log; on failure that step's output goes to stderr
run() {
    local label=$1 step=$work/step.log; shift
    if ! "$@" >"$step" 2>&1; then
        cat "$step" >>"$log"
        echo "cuda-hook-check: FAILED: $label (whole log: $log)" >&2
        grep -v '^make\|^-- ' "$step" | tail -n 60 >&2
        exit 1
    fi
    cat "$step" >>"$log"
}

# 1. The toolkit.
if [ "$quiet" = 1 ]; then bash tools/cuda-tools.sh --quiet; else bash tools/cuda-tools.sh; fi
# shellcheck source=/dev/null
source target/cuda-tools/env.sh
tk=$SPARK_CUDA_TOOLKIT
export LIBRARY_PATH="$tk/lib:$tk/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"

# 2. The patched source tree (tools/llama-tree.sh), made again whenever the series tag changes.
tag=$(bash tools/llama-tree.sh --tag)
mapfile -t patches < <(find "$patch_dir" -maxdepth 1 -name '*.patch' | LC_ALL=C sort)
[ "${#patches[@]}" -gt 0 ] || die "no patches in $patch_dir"
src=$work/tree/llama.cpp
if [ "$(cat "$work/src.stamp" 2>/dev/null)" != "$tag" ]; then
    say "making the patched tree ($tag)"
    rm -rf "$work/tree" "$work/src" "$work/src.stamp" "$work/build-release" "$work/build-debug"
    bash tools/llama-tree.sh "$work/tree" 2>/dev/null || die "tools/llama-tree.sh failed"
    echo "$tag" >"$work/src.stamp"
fi

# The .cu files the series changes (ggml-cuda.cu at least: the hook lives there).
mapfile -t cu_files < <(sed -n 's|^+++ b/ggml/src/ggml-cuda/\([^/]*\.cu\)$|\1|p' "${patches[@]}" | sort -u)
[ "${#cu_files[@]}" -gt 0 ] || die "no patch touches ggml/src/ggml-cuda/*.cu"
objects=()
for f in "${cu_files[@]}"; do objects+=("$f.o"); done

# 3-4. Configure ggml's CUDA backend and build the objects. The llama.cpp options are the
#      published crate's (its build.rs) with the GPU machine's (tools/gpu-check.sh).
build_objects() { # build_objects DIR BUILD_TYPE ARCHS
    local dir=$1 type=$2 archs=$3
    run "cmake configure ($type, $archs)" cmake -S "$src" -B "$dir" \
        -DCMAKE_BUILD_TYPE="$type" -DBUILD_SHARED_LIBS=ON \
        -DGGML_CUDA=ON -DGGML_CUDA_FA=OFF -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF \
        -DGGML_FATAL_WARNINGS=ON \
        -DCMAKE_CUDA_COMPILER="$tk/bin/nvcc" -DCUDAToolkit_ROOT="$tk" \
        -DCMAKE_CUDA_ARCHITECTURES="$archs" \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF
    local o
    for o in "${objects[@]}"; do
        say "nvcc ${o%.o} ($type, sm $archs)"
        run "nvcc ${o%.o} ($type, $archs)" make -C "$dir/ggml/src/ggml-cuda" "$o"
    done
}
build_objects "$work/build-release" Release "75;80;90"
build_objects "$work/build-debug" Debug "75"

# 5. The public header, as C and C++, against the signatures the plugin uses.
cat >"$work/header-check.c" <<'EOF'
#include "ggml-cuda.h"
#include <stddef.h>

static int launch(struct ggml_tensor * dst, int device, void * stream, void * userdata) {
    (void) dst; (void) device; (void) stream; (void) userdata;
    return 0;
}

static void fun(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) dst; (void) ith; (void) nth; (void) userdata;
}

int spark_header_check(void);
int spark_header_check(void) {
    ggml_backend_cuda_custom_launch_t l = launch;
    ggml_backend_cuda_register_custom_op_t reg = (ggml_backend_cuda_register_custom_op_t)
        ggml_backend_reg_get_proc_address(ggml_backend_cuda_reg(), "ggml_backend_cuda_register_custom_op");
    return reg != NULL && reg(fun, l) ? 0 : 1;
}
EOF
inc=$src/ggml/include
run "ggml-cuda.h as C" cc -std=c11 -Wall -Wextra -Werror -I"$inc" -c "$work/header-check.c" -o "$work/header-check-c.o"
run "ggml-cuda.h as C++" c++ -std=c++17 -Wall -Wextra -Werror -I"$inc" -x c++ -c "$work/header-check.c" -o "$work/header-check-cxx.o"

say "ok: ${cu_files[*]} (sm 75;80;90 Release, 75 Debug) and ggml-cuda.h compile ($((SECONDS - start)) s)"
