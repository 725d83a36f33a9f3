#!/usr/bin/env bash
# ggml's AMX matrix products (Intel Xeon 4th gen and later: amx_int8 in /proc/cpuinfo) against
# its plain CPU ones, weight shape by weight shape: tools/amx/amx-mul-mat-check.cpp, which asks
# the AMX buffer type what llama.cpp's loader asks before it places a weight there, and compares
# where it says yes (docs/USAGE.md, "Intel CPUs with AMX").
#
# Usage: bash tools/amx-check.sh [--emulate] [--quiet] [--models] [-- CHECK_ARGS...]
#   (default)   against the project's own llama.cpp build (target/upstream, tools/upstream.sh):
#               the check on the AMX kernels every llama.cpp tool here runs. On a CPU without
#               AMX it says so and exits 0.
#   --emulate   against a separate ggml build (target/amx-emu) of the same patched tree with
#               ggml's AMX code compiled in and the tile instructions done in software
#               (tools/amx/amx-emu.h): the same check on any x86-64 CPU with AVX-512 F/BW/VL/DQ
#               and VNNI, which the AMX code also uses; elsewhere it says so and exits 0.
#               ~1.5 min to build ggml once (again when the patch series changes).
#   --models    the weight shapes of the models the project runs (below) in q8_0, q4_0, q4_K
#               and q6_K, instead of the built-in cases (minutes under --emulate: K up to 16384)
#   --quiet     only failing cases, skips and the summary line
#   CHECK_ARGS  passed to amx-mul-mat-check (--rows, --types, --threads, --buffer-type NAME,
#               --zeros P, --full-n, K,N[,NE2[,NE3]][:B], --gguf FILE: its header says more)
#
# Exit status: 0 every product agrees (or no AMX to check), 1 a product disagrees or crashed,
# 2 usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

emulate=0
quiet=0
models=0
check_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --emulate) emulate=1 ;;
        --quiet) quiet=1 ;;
        --models) models=1 ;;
        --) shift; check_args=("$@"); break ;;
        -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "amx-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
say() { if [ "$quiet" = 0 ]; then echo "amx-check: $*"; fi; }
die() { echo "amx-check: error: $*" >&2; exit 1; }

# Weight shapes {K, N[, NE2]} of the models the project runs (N is shortened by the check to
# its class: see amx-mul-mat-check.cpp), from their configurations: Gemma-2 2B and 9B (and the
# spark-gemma2 files of the same shapes: their dense products are these), Gemma 3n E2B and E4B
# (tools/gemma3n-synth.py's presets: attention, FFN, altup_proj / altup_unembd_proj {d, d, 3},
# per_layer_model_proj, laurel, the per-layer gate and projection), SmolLM2-135M and
# gemma-3-270m (tools/real-models.sh).
MODEL_SHAPES=(
    2304,2048 2304,1024 2048,2304 2304,9216 9216,2304 2304,256000
    3584,4096 3584,2048 4096,3584 3584,14336 14336,3584 3584,256000
    2048,2048 2048,512 2048,8192 8192,2048 2048,2048,3 2048,7680 2048,64 64,2048 2048,256 256,2048
    16384,2048 2048,16384 2048,8960
    576,576 576,192 576,1536 1536,576 576,49152
    640,1024 640,256 1024,640 640,2048 2048,640 640,262144
)

case_args=()
if [ "$models" = 1 ]; then
    case_args=(--types q8_0,q4_0,q4_K,q6_K "${MODEL_SHAPES[@]}")
fi

if [ "$emulate" = 1 ]; then
    # The AMX code's AVX-512 parts run natively; GGML_AVX512 compiles for F, CD, VL, DQ, BW.
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
    missing=()
    for f in avx512f avx512cd avx512vl avx512dq avx512bw avx512_vnni; do
        [[ " $flags " == *" $f "* ]] || missing+=("$f")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "amx-check: skip: --emulate needs AVX-512 with VNNI; this CPU lacks ${missing[*]}"
        exit 0
    fi
    out=$root/target/amx-emu
    tag=$(bash tools/llama-tree.sh --tag)
    emu_header=$root/tools/amx/amx-emu.h
    stamp="$tag $(sha256sum "$emu_header" | cut -c1-16)"
    if [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
        say "making the patched tree ($tag) and building ggml with software AMX tiles in $out"
        rm -rf "$out"
        mkdir -p "$out"
        bash tools/llama-tree.sh "$out/src" >/dev/null
        cmake -S "$out/src/llama.cpp" -B "$out/build" -DCMAKE_BUILD_TYPE=Release \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMON=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
            -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
            -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON \
            -DCMAKE_CXX_FLAGS="-include $emu_header" >"$out/cmake.log" 2>&1 \
            || die "cmake configure failed: $out/cmake.log"
        cmake --build "$out/build" -j "$(nproc)" --target ggml >"$out/build.log" 2>&1 \
            || die "ggml build failed: $out/build.log"
        echo "$stamp" >"$out/stamp"
    fi
    inc=$out/src/llama.cpp/ggml/include
    lib=$out/build/ggml/src
    bin=$out/amx-mul-mat-check
    link=(-Wl,--start-group "$lib/libggml.a" "$lib/libggml-cpu.a" "$lib/libggml-base.a"
          -Wl,--end-group -fopenmp -lpthread -lm -ldl)
    what="ggml's AMX code on software tiles (target/amx-emu)"
else
    out=$root/target/upstream
    [ -f "$out/lib/libggml-cpu.so" ] || die "no llama.cpp build at $out: run bash tools/upstream.sh first"
    inc=$out/include
    bin=$out/amx-mul-mat-check
    link=(-L"$out/lib" -Wl,-rpath,"$out/lib" -lggml -lggml-cpu -lggml-base)
    what="the project's llama.cpp build (target/upstream)"
fi

# The check itself compiles in ~2 s: always from the current source, against this build.
src=$root/tools/amx/amx-mul-mat-check.cpp
g++ -O2 -std=c++17 -Wall -Wextra -I"$inc" "$src" -o "$bin" "${link[@]}" || die "cannot compile $src"

say "$what: ${case_args[*]:-built-in cases} ${check_args[*]:-}"
rc=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$bin" "${case_args[@]}" "${check_args[@]}" >"$log" 2>&1 || rc=$?
if [ "$quiet" = 1 ]; then
    grep -E 'FAIL|^skip|disagree|error' "$log" || true
else
    cat "$log"
fi
case "$rc" in
    0) exit 0 ;;
    77) exit 0 ;;  # no AMX buffer type: the check printed why
    *) echo "amx-check: $what: AMX products disagree with the plain CPU's (exit $rc)" >&2; exit 1 ;;
esac
