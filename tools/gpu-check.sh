#!/usr/bin/env bash
# The GPU checks, run on a machine with an NVIDIA GPU from the repository root with
# what tools/gpu-pack.sh packed into target/gpucarry (the one-line `run` call: tools/README.md).
# Writes $OUT/gpu-check.txt (the report) and $OUT/gpu-logs.tar.gz (every raw log, the bench
# JSON, the profiler CSV); without $OUT, target/gpuwork/out.
#
# Phases, in this order (each one's section of the report is kept in target/gpuwork, so running
# the same command again on the still-warm machine continues where a time limit stopped it):
#   build    the patched llama.cpp with GGML_CUDA=ON for this GPU's architecture (nvidia-smi;
#            90 for H100/H200), GGML_CUDA_FA=OFF, shared libraries, GGML_BUILD_COMMIT_OVERRIDE =
#            the series tag the plugin was built against; tools llama-bench llama-batched-bench
#            llama-perplexity llama-completion llama-quantize. The prebuilt of
#            gpu-pack.sh --cuda-arch when the carry has one for this arch and it loads (seconds),
#            else from target/gpucarry/llama-src.tar.gz (~4 min)
#   correct  the shipped model (models/spark-shakespeare.npz, converted here; quantized here to
#            F16 BF16 Q8_0 Q4_0 Q4_K_M) on models/heldout.txt, llama-perplexity -c 256: CPU with
#            the plugin (GPU hidden) writes --kl-divergence-base, GPU (-ngl 99) with the plugin
#            runs --kl-divergence: mean KLD, same top-1 %, both PPLs (f32 and *-kernels rows with
#            the Spark kernels at every ubatch size, the others with the built-in switch point:
#            256-token ubatches on the dense graph); the same for the dense stock-op graph (no
#            plugin) as the control of what ggml-cuda itself changes; SPARK_STATS=1 keep-rate
#            tables CPU vs GPU; GGML_SCHED_DEBUG=2 shows on which backend every GGML_OP_CUSTOM
#            node ran (prefill and decode) and that the dense answer keeps every layer node on CUDA
#   bench    llama-bench -ngl 99 -fa 0, Spark vs stock Gemma-2 2B (synthetic, spark-convert
#            --synthetic; q8_0 and q4_0) at -p 512 -n 128 -d 0,512,4096 -r 3, each decode ratio
#            beside tools/predict-ratio.py's prediction (tools/gpu-bench-table.py); both q8_0
#            models' decode without CUDA graphs
#   switch   where the dense graph should take over (spark-backend/src/dense_switch.rs): pp512 of
#            the 2B q8_0 models at -ub 8..512 with the Spark kernels always
#            (SPARK_FFN_DENSE_FROM=0, SPARK_ATTN_DENSE_FROM=0), the dense graph always (1, 1),
#            the dense FFN with sparse attention (1, 0), and stock (tools/gpu-switch-table.py)
#   bench9b  the same for the 9B presets (spark-gemma2-9b, gemma2-9b: ~10 GB each in q8_0)
#   prof     device-to-device copy bandwidth (PyTorch), then each Spark kernel's time and DRAM
#            bytes (nsys if it works here, else ncu) against it
#   batched  tools/bench-batched.sh -npl 1,4,16 -- -ngl 99 (llama-batched-bench, q8_0)
#   scaling  the CPU alone (GPU hidden): tools/bench-scaling.sh -t 4,8,16, decode at depth 512
#   gemma3n  Gemma 3n's sparse layers (tools/gemma3n-synth.py, tiny or GPU_CHECK_GEMMA3N_PRESET=e2b)
#            with -ngl 99: the same text as upstream's graph, the plugin's rows 0-9, custom nodes
#            on CUDA, llama-bench with and without the plugin
#
# Fails (exit 1) when the build fails, the GPU run's KL divergence or top-1 agreement is out of
# bounds, SPARK_STATS differ, or the Spark kernels did not run on the GPU (the plugin's
# "spark-backend: CUDA kernels registered" line missing, or a GGML_OP_CUSTOM node scheduled on
# the CPU under -ngl 99). Exit 2: passed so far, but a phase was skipped for time (run again).
#
# Usage: bash tools/gpu-check.sh [--phases build,correct,bench,switch,bench9b,prof,batched,scaling,gemma3n]
#                                [--budget SECONDS] [--redo]
#   --budget   stop starting phases that would not end within SECONDS of the start (default 570,
#              inside a 10-minute slot)
#   --redo     ignore the kept sections and run every phase again (the build stays incremental)
# Tunables (environment): GPU_CHECK_CHUNKS (40 perplexity chunks of 256 tokens),
# GPU_CHECK_MAX_KLD (5e-4), GPU_CHECK_MIN_TOP1 (98.5 %), GPU_CHECK_UB_CHUNKS (8: the -ub 1/8 rows),
# GPU_CHECK_BENCH_REPS (3), GPU_CHECK_BENCH_TYPES ("q8_0 q4_0"), GPU_CHECK_KERNELS ("22,22":
# Spark's and stock's kernels per layer per decode step for the predictions: 31 on the H200
# 2026-11-27 by hand; now tools/cuda-kernel-count.py's count of the built graphs, 22 for Spark
# since select-up + gather, the in-op chunk sums, no h[:r_f] copy, Q's one spark_rope, K's
# rope fused with its store and the attention's selection and output in one launch, 22 for
# stock),
# GPU_CHECK_STACK_QKV (0; 1: the synthetic Spark models are written with spark-convert
# --stack-qkv, Wq/Wk/Wv as one matrix: 18 kernels per decode layer instead of 22, set
# GPU_CHECK_KERNELS=18,22 with it; on a fresh work folder: the models are made once),
# GPU_CHECK_GEMMA3N_PRESET (tiny), CUDA_ARCH (from nvidia-smi); for gpu-pack.sh's prebuild:
# GPU_CHECK_WORK (target/gpuwork), GPU_CHECK_PREBUILD=1 (build only, no GPU, portable CPU code).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

phases=build,correct,bench,switch,bench9b,prof,batched,scaling,gemma3n budget=570 redo=0
while [ $# -gt 0 ]; do
    case "$1" in
        --phases) phases=$2; shift ;;
        --budget) budget=$2; shift ;;
        --redo) redo=1 ;;
        -h|--help) sed -n '2,51p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

carry=$root/target/gpucarry
work=${GPU_CHECK_WORK:-$root/target/gpuwork}
out=${OUT:-$work/out}
logs=$work/logs
mkdir -p "$out" "$work/sections" "$logs" "$work/models" "$work/kld"
report=$out/gpu-check.txt
: >"$report"
start=$SECONDS
deadline=$((start + budget))
failures=()
skipped=()

section=
# emit: stdin to the terminal, the report and (inside a phase) the phase's kept section
emit() { if [ -n "$section" ]; then tee -a "$report" "$section"; else tee -a "$report"; fi; }
say() { echo "$*" | emit; }
fail() { failures+=("$1"); say "FAIL: $1"; }
left() { echo $((deadline - SECONDS)); }
# Saves the logs into $OUT after every phase: what is there when a time limit kills the command
# still comes back.
save_logs() { tar -C "$work" -czf "$out/gpu-logs.tar.gz.tmp" logs bench.json bench-9b.json bench-nographs.json scaling.json prof 2>/dev/null
              mv -f "$out/gpu-logs.tar.gz.tmp" "$out/gpu-logs.tar.gz"; }
has_phase() { [[ ",$phases," == *",$1,"* ]]; }

[ -f "$carry/llama-src.tar.gz" ] && [ -f "$carry/libggml-spark.so" ] && [ -x "$carry/spark-convert" ] \
    && [ -f "$carry/series-tag" ] || { say "FAIL: target/gpucarry is incomplete: run bash tools/gpu-pack.sh here first and carry target/gpucarry"; exit 1; }
tag=$(cat "$carry/series-tag")
plugin=$carry/libggml-spark.so
convert=$carry/spark-convert
threads=$(nproc)
# The sections kept from an earlier run are valid for the same carry and the same script.
stamp=$(cat "$carry/MANIFEST" "$carry/series-tag" "$root/tools/gpu-check.sh" | sha256sum | cut -c1-16)
if [ "$redo" = 1 ] || [ "$(cat "$work/sections/stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -f "$work/sections/"*
    echo "$stamp" >"$work/sections/stamp"
fi

# --- environment -------------------------------------------------------------------------------
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
cuda_root=${nvcc:+$(cd "$(dirname "$nvcc")/.." && pwd)}
# the plugin loads libcuda (driver) and libnvrtc (toolkit) at run time
for d in "$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib" /usr/local/nvidia/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
arch=${CUDA_ARCH:-}
if [ -z "$arch" ] && command -v nvidia-smi >/dev/null; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
fi
arch=${arch:-90}
say "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), phases $phases, budget ${budget}s"
say "== environment"
if command -v nvidia-smi >/dev/null; then
    say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -2)"
else
    say "GPU: nvidia-smi missing"
fi
say "nvcc: $(${nvcc:-false} --version 2>/dev/null | grep -o 'release [0-9.]*' || echo missing); cmake: $(cmake --version | head -1)"
say "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $threads CPUs; CUDA arch $arch"
sed 's/^/carry: /' "$carry/MANIFEST" | emit

# run_phase NAME SECONDS_NEEDED FUNCTION: runs it unless its section is kept, or skips it when
# the budget cannot hold it.
run_phase() {
    local name=$1 need=$2 fn=$3 sec=$work/sections/$1
    has_phase "$name" || return 0
    if [ -f "$sec.done" ]; then
        say "== $name (kept from an earlier run of this carry)"
        emit <"$sec.txt"
        if [ -s "$sec.fail" ]; then while read -r f; do failures+=("$f"); done <"$sec.fail"; fi
        return 0
    fi
    if [ "$(left)" -lt "$need" ]; then
        say "== $name: SKIPPED, needs ~${need}s, $(left)s left (run the same command again)"
        skipped+=("$name")
        return 0
    fi
    say "== $name"
    local n_fail=${#failures[@]} t0=$SECONDS rc
    section=$sec.txt
    : >"$section"
    "$fn"
    rc=$?
    say "($name: $((SECONDS - t0)) s)"
    section=
    printf '%s\n' "${failures[@]:$n_fail}" | sed '/^$/d' >"$sec.fail"
    if [ "$rc" = 0 ]; then touch "$sec.done"; fi
    save_logs
}

# --- build -------------------------------------------------------------------------------------
# Two ways to the CUDA build, the same cmake options either way (cuda_build):
# - prebuilt: tools/gpu-pack.sh --cuda-arch ARCH made it on the dev machine with the PyPI nvcc
#   (target/gpucarry/llama-cuda-smARCH.tar.xz: bin/ with the tools and shared libraries, RPATH
#   $ORIGIN); used when its arch and tag match and every library it needs resolves here;
# - from source: target/gpucarry/llama-src.tar.gz, built here (~4 min on 16 cores).
src=$work/src/llama.cpp
bld=$work/build
bin=$bld/bin
tools_built=(llama-bench llama-batched-bench llama-perplexity llama-completion llama-quantize)

# cuda_build: configure and build the tools in $bld from $src. A prebuild (GPU_CHECK_PREBUILD=1)
# builds the CPU backend for x86-64-v3 (AVX2 FMA F16C BMI2) instead of -march=native: it must run
# on a CPU nobody has seen. With SPARK_CUDA_TOOLKIT (tools/cuda-tools.sh, the dev machine) it
# compiles and links against that toolkit root and its libcuda stub.
cuda_build() {
    local gen=() cpu=(-DGGML_NATIVE=ON) tk=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    [ -f "$bld/CMakeCache.txt" ] && gen=()
    if [ "${GPU_CHECK_PREBUILD:-0}" = 1 ]; then
        cpu=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
    fi
    if [ -n "${SPARK_CUDA_TOOLKIT:-}" ]; then
        # --no-as-needed: the libcuda stub defines none of the driver functions ggml-cuda calls,
        # and Debian's gcc links --as-needed by default, which would drop libcuda.so.1 from
        # libggml-cuda.so's needed libraries (the GPU machine's loader then misses cuDeviceGet)
        tk=(-DCUDAToolkit_ROOT="$SPARK_CUDA_TOOLKIT" -DCMAKE_CUDA_COMPILER="$SPARK_CUDA_TOOLKIT/bin/nvcc"
            "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-as-needed")
        export LIBRARY_PATH="$SPARK_CUDA_TOOLKIT/lib:$SPARK_CUDA_TOOLKIT/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
    elif [ -n "$nvcc" ]; then
        tk=(-DCMAKE_CUDA_COMPILER="$nvcc")
    fi
    if ! cmake -S "$src" -B "$bld" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
            -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
            -DGGML_CUDA_FA=OFF "${cpu[@]}" -DGGML_RPC=ON -DGGML_CCACHE=OFF \
            -DGGML_BUILD_COMMIT_OVERRIDE="$tag" \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            "${tk[@]}" >"$logs/cmake-configure.log" 2>&1; then
        tail -n 30 "$logs/cmake-configure.log" | emit
        fail "build: cmake configure failed"; return 1
    fi
    if ! cmake --build "$bld" -j "$threads" --target "${tools_built[@]}" >"$logs/cmake-build.log" 2>&1; then
        grep -m 20 -B2 -A6 'error' "$logs/cmake-build.log" | emit
        fail "build: compile failed (logs/cmake-build.log)"; return 1
    fi
}

unpack_src() {
    # the tree is the series (its tag) plus the tools' sdist: unpacked again only when they change
    # (a new tarball of the same tree keeps an incremental build)
    local tstamp
    tstamp="$tag $(grep '^tools_sdist ' "$carry/MANIFEST")"
    if [ "$(cat "$work/src.stamp" 2>/dev/null)" != "$tstamp" ]; then
        rm -rf "$work/src.new"
        mkdir -p "$work/src.new"
        tar -xzf "$carry/llama-src.tar.gz" -C "$work/src.new" || { fail "build: cannot unpack llama-src.tar.gz"; return 1; }
        if [ -d "$work/src" ]; then
            # only the files that differ are replaced (new modification times), so a changed
            # patch rebuilds incrementally
            python3 - "$work/src.new" "$work/src" <<'EOF' || { fail "build: cannot update the source tree"; return 1; }
import filecmp, os, shutil, sys
new, old = sys.argv[1], sys.argv[2]
keep = set()
for d, _, files in os.walk(new):
    for f in files:
        rel = os.path.relpath(os.path.join(d, f), new)
        keep.add(rel)
        src, dst = os.path.join(new, rel), os.path.join(old, rel)
        if not os.path.exists(dst) or not filecmp.cmp(src, dst, shallow=False):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
for d, _, files in os.walk(old):
    for f in files:
        rel = os.path.relpath(os.path.join(d, f), old)
        if rel not in keep:
            os.remove(os.path.join(old, rel))
EOF
            rm -rf "$work/src.new"
        else
            mv "$work/src.new" "$work/src"
        fi
        echo "$tstamp" >"$work/src.stamp"
    fi
    [ "$(cat "$src/SPARK_SERIES_TAG")" = "$tag" ] \
        || { fail "build: the source tarball's tag $(cat "$src/SPARK_SERIES_TAG") is not the plugin's $tag"; return 1; }
}

# use_prebuilt: unpacks the carried prebuilt for this arch into $bin when it carries the
# plugin's tag and every library it needs resolves on this machine; else returns 1 and says why.
use_prebuilt() {
    local pre=$carry/llama-cuda-sm$arch.tar.xz missing
    [ -f "$pre" ] || { say "no prebuilt for sm_$arch in the carry: building from source"; return 1; }
    rm -rf "$bld"
    mkdir -p "$bld"
    tar -xJf "$pre" -C "$bld" || { say "cannot unpack $(basename "$pre"): building from source"; return 1; }
    if [ "$(cat "$bld/SPARK_SERIES_TAG" 2>/dev/null)" != "$tag" ]; then
        say "the prebuilt's tag $(cat "$bld/SPARK_SERIES_TAG" 2>/dev/null) is not the plugin's $tag: building from source"
        rm -rf "$bld"; return 1
    fi
    missing=$(ldd "$bin"/llama-* "$bin"/*.so 2>&1 | grep 'not found' | sort -u | tr -s ' \t' ' ')
    if [ -n "$missing" ]; then
        say "the prebuilt needs libraries this machine lacks ($missing): building from source"
        rm -rf "$bld"; return 1
    fi
    say "prebuilt $(basename "$pre") ($(cat "$bld/BUILT_ON" 2>/dev/null)): $(ldd "$bin/libggml-cuda.so" \
        | grep -o 'lib\(cudart\|cublas\|cuda\)\.so[.0-9]* => [^ ]*' | tr '\n' ' ')"
}

phase_build() {
    if [ "${GPU_CHECK_PREBUILD:-0}" = 1 ]; then
        # on the dev machine, for gpu-pack.sh --cuda-arch: no GPU to check the plugin against
        unpack_src && cuda_build || return 1
        say "built in $bld (CUDA arch $arch, ggml_commit $tag, x86-64-v3 CPU backend)"
        return 0
    fi
    if ! use_prebuilt; then
        unpack_src && cuda_build || return 1
    fi
    say "CUDA build in $bld (arch $arch, ggml_commit $tag): $(cd "$bin" && echo llama-*)"
    # the plugin accepts this ggml (same tag) and registers its CUDA launchers
    GGML_BACKEND_PATH=$plugin "$bin/llama-completion" --list-devices >"$logs/list-devices.log" 2>&1
    sed -n '/spark-backend\|CUDA0\|Available devices/p' "$logs/list-devices.log" | head -8 | emit
    if grep -q 'not registering' "$logs/list-devices.log"; then
        fail "build: the plugin refused this ggml (see logs/list-devices.log)"; return 1
    fi
    if ! grep -q 'CUDA0' "$logs/list-devices.log"; then
        tail -n 5 "$logs/list-devices.log" | emit
        fail "build: llama-completion lists no CUDA0 device (logs/list-devices.log)"; return 1
    fi
}
build_need=420
[ -f "$carry/llama-cuda-sm$arch.tar.xz" ] && build_need=60
run_phase build "$build_need" phase_build
if [ ! -x "$bin/llama-perplexity" ] || [ ! -f "$work/sections/build.done" ]; then
    # the other phases need the build
    for p in correct bench switch bench9b prof batched scaling gemma3n; do has_phase "$p" && skipped+=("$p"); done
    phases=build
fi

# --- correct -----------------------------------------------------------------------------------
chunks=${GPU_CHECK_CHUNKS:-40}
# the Spark kernels at every ubatch size (no dense answer from spark-backend/src/dense_switch.rs)
spark_kernels_always="SPARK_FFN_DENSE_FROM=0 SPARK_ATTN_DENSE_FROM=0"
max_kld=${GPU_CHECK_MAX_KLD:-5e-4}
min_top1=${GPU_CHECK_MIN_TOP1:-98.5}
ub_chunks=${GPU_CHECK_UB_CHUNKS:-8}

# kld_pair LABEL MODEL PLUGIN(yes|no) CHUNKS [GPU ARGS...]: CPU base run (whole 256-token
# ubatches), GPU KLD run (with the extra arguments, e.g. -ub 1 for the decode kernels, and the
# variables of $KLD_ENV, e.g. $spark_kernels_always); prints one table row. Each run is bounded
# (a hang must not take the call's other phases with it).
kld_pair() {
    local label=$1 model=$2 with=$3 n_chunks=$4 env_plugin=() gpu_env
    shift 4
    read -r -a gpu_env <<<"${KLD_ENV:-}"
    [ "$with" = yes ] && env_plugin=(GGML_BACKEND_PATH="$plugin")
    # SPARK_STATS for the statistics table (f32) only: it turns ggml-cuda's CUDA graphs off, so
    # the other rows check the logits of captured and replayed graphs
    [ "$label" = f32 ] && env_plugin+=(SPARK_STATS=1)
    local cpu=$logs/ppl-$label-cpu.log gpu=$logs/ppl-$label-gpu.log base=$work/kld/$label.kld
    env "${env_plugin[@]}" CUDA_VISIBLE_DEVICES= timeout 120 \
        "$bin/llama-perplexity" -m "$model" -f models/heldout.txt -c 256 --chunks "$n_chunks" -t "$threads" \
        --no-warmup -ngl 0 --kl-divergence-base "$base" >"$cpu" 2>&1 \
        || { fail "correct: $label CPU run failed (logs/$(basename "$cpu"))"; return; }
    env "${env_plugin[@]}" "${gpu_env[@]}" timeout 120 \
        "$bin/llama-perplexity" -m "$model" -c 256 -t "$threads" --no-warmup -ngl 99 "$@" \
        --kl-divergence-base "$base" --kl-divergence >"$gpu" 2>&1 \
        || { fail "correct: $label GPU run failed (logs/$(basename "$gpu"))"; return; }
    local ppl_cpu ppl_q ppl_base kld top1
    ppl_cpu=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$cpu" | tail -1)
    ppl_q=$(sed -n 's/^Mean PPL(Q) *: *\([0-9.]*\).*/\1/p' "$gpu" | tail -1)
    ppl_base=$(sed -n 's/^Mean PPL(base) *: *\([0-9.]*\).*/\1/p' "$gpu" | tail -1)
    kld=$(sed -n 's/^Mean *KLD: *\([0-9.eE+-]*\).*/\1/p' "$gpu" | tail -1)
    top1=$(sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$gpu" | tail -1)
    printf '| %-12s | %-6s | %10s | %10s | %10s | %10s | %7s |\n' "$label" "$with" "${ppl_cpu:-?}" \
        "${ppl_q:-?}" "${ppl_base:-?}" "${kld:-?}" "${top1:-?}" | emit
    if [ "$with" = yes ]; then
        grep -q 'spark-backend: CUDA kernels registered' "$gpu" \
            || fail "correct: $label: no 'spark-backend: CUDA kernels registered' in the GPU run ($(grep -m1 'spark-backend' "$gpu" || echo 'no spark-backend line'))"
        if [ -z "$kld" ] || [ -z "$top1" ] \
                || ! python3 -c "import sys; sys.exit(0 if float('$kld') <= float('$max_kld') and float('$top1') >= float('$min_top1') else 1)"; then
            fail "correct: $label: GPU vs CPU mean KLD ${kld:-?} (max $max_kld), same top-1 ${top1:-?} % (min $min_top1)"
        fi
    fi
}

# sched_check LABEL LOG custom|layers: counts nodes per backend in a GGML_SCHED_DEBUG=2 log.
# custom: the GGML_OP_CUSTOM nodes (the Spark ops) must all be on CUDA; layers: no node of a
# layer (named "<name>-<layer>" by the graph) on the CPU, for graphs without Spark ops (the dense
# answer above the switch point: V's copy and products must stay on the GPU)
sched_check() {
    local label=$1 log=$2 mode=$3 counts
    counts=$(python3 - "$log" "$mode" <<'EOF'
import re, sys, collections
c = collections.Counter()
pat = re.compile(r'node #\s*\d+ \(\s*(\S+)\): +(\S+) \(.{5}\) \[(.{5})')
for line in open(sys.argv[1], errors="replace"):
    m = pat.search(line)
    if not m:
        continue
    op, name, backend = m.group(1), m.group(2), m.group(3).strip()
    if (op == "CUSTOM") if sys.argv[2] == "custom" else re.search(r"-\d+$", name):
        c[backend] += 1
print(" ".join(f"{k}={v}" for k, v in sorted(c.items())) or "none")
EOF
    )
    local what="GGML_OP_CUSTOM nodes"
    [ "$mode" = layers ] && what="layer nodes"
    say "$what by backend ($label, -ngl 99): $counts; splits: $(grep -c '## SPLIT' "$log")"
    if ! grep -q 'node #' "$log"; then
        fail "correct: $label: GGML_SCHED_DEBUG=2 printed no node lines (logs/$(basename "$log")): cannot tell where the nodes ran"
        return 0
    fi
    [[ "$counts" == *CUDA* ]] || fail "correct: $label: no $what ran on CUDA ($counts)"
    [[ "$counts" == *CPU* ]] && fail "correct: $label: $what scheduled on the CPU ($counts)"
    return 0
}

stats_table() { grep '^spark-stats: *[0-9]' "$1" | awk '{print $2, $3, $4, $5, $6}'; }

phase_correct() {
    local m=$work/models
    if [ ! -f "$m/shakespeare-f32.gguf" ]; then
        "$convert" models/spark-shakespeare.npz "$m/shakespeare-f32.gguf" --outtype f32 --force --quiet \
            >"$logs/convert.log" 2>&1 || { fail "correct: spark-convert failed"; return 1; }
    fi
    local types=(F16 BF16 Q8_0 Q4_0 Q4_K_M) t
    for t in "${types[@]}"; do
        [ -f "$m/shakespeare-$t.gguf" ] || "$bin/llama-quantize" "$m/shakespeare-f32.gguf" \
            "$m/shakespeare-$t.gguf" "$t" >>"$logs/quantize.log" 2>&1 \
            || fail "correct: llama-quantize $t failed"
    done
    say "llama-perplexity -c 256 --chunks $chunks, models/heldout.txt; CPU: GPU hidden (CUDA_VISIBLE_DEVICES=), -ngl 0;"
    say "GPU: -ngl 99 --kl-divergence against the CPU run. Bounds: mean KLD <= $max_kld, same top-1 >= $min_top1 %."
    say ""
    say "| model        | plugin | PPL CPU    | PPL(Q) GPU | PPL(base)  | mean KLD   | top-1 % |"
    say "|---|---|---|---|---|---|---|"
    # f32: the Spark kernels at 256-token ubatches too (its SPARK_STATS table is compared below);
    # the other types as users get them: 256-token ubatches take the dense graph on CUDA
    # (spark-backend/src/dense_switch.rs), so their rows check V's copy and the stock products
    KLD_ENV=$spark_kernels_always kld_pair f32 "$m/shakespeare-f32.gguf" yes "$chunks"
    for t in "${types[@]}"; do
        [ -f "$m/shakespeare-$t.gguf" ] && kld_pair "$t" "$m/shakespeare-$t.gguf" yes "$chunks"
    done
    kld_pair f32-switch "$m/shakespeare-f32.gguf" yes "$ub_chunks"
    KLD_ENV=$spark_kernels_always kld_pair Q8_0-kernels "$m/shakespeare-Q8_0.gguf" yes "$ub_chunks"
    KLD_ENV=$spark_kernels_always kld_pair Q4_K_M-kernels "$m/shakespeare-Q4_K_M.gguf" yes "$ub_chunks"
    # the decode kernels (one token per ubatch: select-up and gather, the attention
    # of one query) and the small-batch path (8 tokens) against the CPU's whole-chunk logits
    kld_pair f32-ub1 "$m/shakespeare-f32.gguf" yes "$ub_chunks" -b 256 -ub 1
    kld_pair Q8_0-ub1 "$m/shakespeare-Q8_0.gguf" yes "$ub_chunks" -b 256 -ub 1
    kld_pair f32-ub8 "$m/shakespeare-f32.gguf" yes "$ub_chunks" -b 256 -ub 8
    kld_pair f32-dense "$m/shakespeare-f32.gguf" no "$chunks"
    say "(-ub N: the GPU run evaluates N tokens per ubatch, over $ub_chunks chunks; f32 and *-kernels: the Spark kernels at every ubatch size ($spark_kernels_always); f32-switch and the other types: the built-in switch point (256-token ubatches on the dense graph); plugin 'no': the dense stock-op graph, i.e. what ggml-cuda's own kernels change; not bounded)"

    say ""
    say "SPARK_STATS=1, f32 model, same tokens: CPU | GPU (layer, ffn_keep_rate, ffn_tokens, attn_mean_positions, attn_queries)"
    local a=$work/stats-cpu.txt b=$work/stats-gpu.txt
    stats_table "$logs/ppl-f32-cpu.log" >"$a"
    stats_table "$logs/ppl-f32-gpu.log" >"$b"
    paste -d'|' "$a" "$b" | sed 's/^/  /; s/|/   |   /' | emit
    if [ ! -s "$b" ]; then
        fail "correct: no SPARK_STATS table from the GPU run ($(grep -m1 'spark-stats' "$logs/ppl-f32-gpu.log" || echo 'nothing'))"
    elif ! python3 - "$a" "$b" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
ok = len(a) == len(b) and len(a) > 0
for x, y in zip(a, b):
    layer, keep_a, tok_a, pos_a, q_a = x
    _, keep_b, tok_b, pos_b, q_b = y
    if tok_a != tok_b or q_a != q_b:
        ok = False
    if abs(float(keep_a) - float(keep_b)) > 0.002:
        ok = False
    if abs(float(pos_a) - float(pos_b)) > 0.01 * max(1.0, float(pos_a)):
        ok = False
sys.exit(0 if ok else 1)
EOF
    then
        fail "correct: SPARK_STATS differ between CPU and GPU (keep rate > 0.002, positions > 1 %, or counts)"
    fi

    say ""
    # on which backend the nodes run: a prefill graph (one 256-token chunk) with the Spark kernels
    # forced and with the built-in switch (the dense graph: no layer node may fall back to the
    # CPU), and decode graphs
    local sched_env
    read -r -a sched_env <<<"$spark_kernels_always"
    env "${sched_env[@]}" GGML_SCHED_DEBUG=2 GGML_BACKEND_PATH="$plugin" timeout 120 "$bin/llama-perplexity" \
        -m "$m/shakespeare-f32.gguf" -f models/heldout.txt -c 256 --chunks 1 -b 256 -ngl 99 -t "$threads" \
        --no-warmup -v >"$logs/sched-prefill.log" 2>&1 || fail "correct: the GGML_SCHED_DEBUG prefill run failed"
    sched_check prefill "$logs/sched-prefill.log" custom
    GGML_SCHED_DEBUG=2 GGML_BACKEND_PATH=$plugin timeout 120 "$bin/llama-perplexity" -m "$m/shakespeare-Q8_0.gguf" \
        -f models/heldout.txt -c 256 --chunks 1 -b 256 -ngl 99 -t "$threads" --no-warmup -v \
        >"$logs/sched-prefill-dense.log" 2>&1 || fail "correct: the GGML_SCHED_DEBUG dense prefill run failed"
    sched_check "prefill, Q8_0, the dense answer" "$logs/sched-prefill-dense.log" layers
    GGML_SCHED_DEBUG=2 GGML_BACKEND_PATH=$plugin timeout 120 "$bin/llama-completion" -m "$m/shakespeare-f32.gguf" \
        -p "ROMEO:" -n 8 --temp 0 -no-cnv -ngl 99 -t "$threads" --no-warmup -v \
        >"$logs/sched-decode.log" 2>&1 </dev/null || fail "correct: the GGML_SCHED_DEBUG decode run failed"
    sched_check decode "$logs/sched-decode.log" custom
    say "CUDA graphs of the decode run (8 tokens): $(grep -c 'CUDA graph warmup complete' "$logs/sched-decode.log") captured after warmup, $(grep -c 'CUDA Graph id .* reused' "$logs/sched-decode.log") reused"
    grep -m3 'spark-backend' "$logs/sched-decode.log" | sed 's/^/plugin: /' | emit
    # the kernels per decode layer that tools/cuda-kernel-count.py's model of ggml-cuda reads
    # from this run's own graph (f32 weights: one kernel per matrix product), to hold against
    # the profiler's counts (prof phase)
    gguf_python "$root/tools/cuda-kernel-count.py" "$logs/sched-decode.log" --model "$m/shakespeare-f32.gguf" \
        2>&1 | tail -n 2 | sed 's/^/kernel model (f32 weights): /' | emit

    # greedy text, CPU vs GPU, Q8_0 (informative: the -ub 1 rows above bound the decode logits)
    local dev text=()
    for dev in cpu gpu; do
        local hide=() ngl=99
        [ "$dev" = cpu ] && hide=(CUDA_VISIBLE_DEVICES=) ngl=0
        env "${hide[@]}" GGML_BACKEND_PATH="$plugin" timeout 60 "$bin/llama-completion" \
            -m "$m/shakespeare-Q8_0.gguf" -p "ROMEO:" -n 48 --temp 0 -no-cnv -ngl "$ngl" -t "$threads" \
            --no-warmup >"$logs/greedy-$dev.txt" 2>"$logs/greedy-$dev.log" </dev/null
        text+=("$(tr '\n' '|' <"$logs/greedy-$dev.txt")")
    done
    say "greedy, Q8_0, 48 tokens after 'ROMEO:' ('|' = newline):"
    say "  CPU: ${text[0]}"
    say "  GPU: ${text[1]}"
    if [ "${text[0]}" = "${text[1]}" ]; then say "  the same text"; else say "  the texts differ"; fi
    return 0
}
run_phase correct 170 phase_correct

# --- bench -------------------------------------------------------------------------------------
bench_types=${GPU_CHECK_BENCH_TYPES:-q8_0 q4_0}
# synthetic_model PRESET TYPE: the random-weight model $work/models/PRESET-TYPE.gguf, made once:
# spark-convert --synthetic writes f32/f16/bf16/q8_0; other types are llama-quantize'd from q8_0
# (weights are random: requantizing changes no speed)
synthetic_model() {
    local p=$1 t=$2 m=$work/models
    [ -f "$m/$p-$t.gguf" ] && return 0
    case "$t" in
        f32|f16|bf16|q8_0)
            local stack=()
            [ "${GPU_CHECK_STACK_QKV:-0}" = 1 ] && [[ "$p" == spark-* ]] && stack=(--stack-qkv)
            "$convert" --synthetic "$p" "$m/$p-$t.gguf" --outtype "$t" "${stack[@]}" --quiet \
                >>"$logs/synthetic.log" 2>&1 ;;
        *)
            synthetic_model "$p" q8_0 && "$bin/llama-quantize" --allow-requantize "$m/$p-q8_0.gguf" \
                "$m/$p-$t.gguf" "${t^^}" "$threads" >>"$logs/synthetic.log" 2>&1 ;;
    esac || { rm -f "$m/$p-$t.gguf"; fail "bench: the synthetic $p $t model failed (logs/synthetic.log)"; return 1; }
}

# bench_table JSON: llama-bench's JSON of Spark and stock models (file names PRESET-TYPE.gguf) as
# one row per model, type, test, depth and thread count with the Spark/stock ratio and, beside
# each decode ratio, tools/predict-ratio.py's prediction for the same files (bytes per step plus
# GPU_CHECK_KERNELS kernels per layer; gguf-py from the carry's gguf wheel)
bench_table() {
    gguf_python "$root/tools/gpu-bench-table.py" "$1" --kernels "${GPU_CHECK_KERNELS:-22,22}"
}

# gguf_python SCRIPT ARGS...: python3 SCRIPT with gguf-py from the carry's gguf wheel (unpacked
# once into $work/gguf-py)
gguf_python() {
    local wheel
    wheel=$(ls "$carry"/gguf-*.whl 2>/dev/null | head -1)
    if [ -n "$wheel" ] && [ ! -d "$work/gguf-py/gguf" ]; then
        python3 -m zipfile -e "$wheel" "$work/gguf-py" || say "cannot unpack $wheel (no gguf-py)"
    fi
    PYTHONPATH="$work/gguf-py${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"
}

# bench_llama SIZE JSON: llama-bench -ngl 99 of the Spark and stock models of SIZE (2b, 9b) in
# every type of bench_types, the plugin loaded (the stock models never call it), into JSON
bench_llama() {
    local size=$1 json=$2 t p models=()
    for t in $bench_types; do
        for p in "spark-gemma2-$size" "gemma2-$size"; do
            synthetic_model "$p" "$t" || return 1
            models+=(-m "$work/models/$p-$t.gguf")
        done
    done
    local reps=${GPU_CHECK_BENCH_REPS:-3}
    say "llama-bench ($size) -ngl 99 -fa 0 -p 512 -n 128 -d 0,512,4096 -r $reps, plugin loaded (the stock models never call it)"
    if ! GGML_BACKEND_PATH=$plugin timeout "$(( $(left) - 10 ))" "$bin/llama-bench" "${models[@]}" \
            -ngl 99 -fa 0 -p 512 -n 128 -d 0,512,4096 -r "$reps" -o json \
            >"$json" 2>"$logs/bench-$size.log"; then
        tail -n 5 "$logs/bench-$size.log" | emit
        fail "bench: llama-bench ($size) failed or ran out of time (logs/bench-$size.log)"; return 1
    fi
    bench_table "$json" | emit
    grep -m2 'spark-backend' "$logs/bench-$size.log" | sed 's/^/plugin: /' | emit
}

phase_bench() {
    bench_llama 2b "$work/bench.json" || return 1
    local reps=${GPU_CHECK_BENCH_REPS:-3}
    # What CUDA graphs give each model's decode: the same test with GGML_CUDA_DISABLE_GRAPHS=1
    local q8=(-m "$work/models/spark-gemma2-2b-q8_0.gguf" -m "$work/models/gemma2-2b-q8_0.gguf")
    if [ -f "$work/models/gemma2-2b-q8_0.gguf" ] && GGML_BACKEND_PATH=$plugin GGML_CUDA_DISABLE_GRAPHS=1 \
            timeout "$(( $(left) - 10 ))" "$bin/llama-bench" "${q8[@]}" -ngl 99 -fa 0 -p 0 -n 128 -d 512 \
            -r "$reps" -o json >"$work/bench-nographs.json" 2>"$logs/bench-nographs.log"; then
        python3 - "$work/bench-nographs.json" <<'EOF' | emit
import json, os, sys
for r in json.load(open(sys.argv[1])):
    name = os.path.basename(r["model_filename"]).removesuffix(".gguf")
    print(f"{name} tg128 @ d512 with GGML_CUDA_DISABLE_GRAPHS=1: {r['avg_ts']:.2f} +/- {r['stddev_ts']:.2f} t/s")
EOF
    fi
    return 0
}
# seconds seen on an H200 (2026-11-27): the whole phase 94 s with its four models made
bench_need=100
for t in $bench_types; do
    for p in spark-gemma2-2b gemma2-2b; do [ -f "$work/models/$p-$t.gguf" ] || bench_need=$((bench_need + 15)); done
done
run_phase bench "$bench_need" phase_bench

# --- switch: the ubatch size from which the dense graph beats the Spark kernels ----------------
switch_ubs=8,16,32,64,128,512
# switch_run NAME FFN_FROM ATTN_FROM MODEL...: llama-bench pp512 at -ub $switch_ubs into $work/switch-NAME.json
switch_run() {
    local name=$1 ffn=$2 attn=$3; shift 3
    GGML_BACKEND_PATH=$plugin SPARK_FFN_DENSE_FROM=$ffn SPARK_ATTN_DENSE_FROM=$attn \
        timeout "$(( $(left) - 10 ))" "$bin/llama-bench" "$@" -ngl 99 -fa 0 -p 512 -n 0 -b 512 \
        -ub "$switch_ubs" -r 2 -o json >"$work/switch-$name.json" 2>"$logs/switch-$name.log" \
        || { tail -n 5 "$logs/switch-$name.log" | emit; fail "switch: llama-bench ($name) failed (logs/switch-$name.log)"; return 1; }
}
phase_switch() {
    local spark=$work/models/spark-gemma2-2b-q8_0.gguf stock=$work/models/gemma2-2b-q8_0.gguf
    synthetic_model spark-gemma2-2b q8_0 && synthetic_model gemma2-2b q8_0 || return 1
    say "llama-bench -ngl 99 -fa 0 -p 512 -n 0 -ub $switch_ubs -r 2 (2B q8_0): Spark kernels, dense graph, dense FFN only, stock"
    switch_run sparse 0 0 -m "$spark" -m "$stock" || return 1
    switch_run dense 1 1 -m "$spark" || return 1
    switch_run ffn-dense 1 0 -m "$spark" || return 1
    python3 "$root/tools/gpu-switch-table.py" "$work"/switch-{sparse,dense,ffn-dense}.json | emit
}
# estimate (not yet seen on a GPU): three llama-bench runs of six ubatch sizes, ~30 s each
run_phase switch 100 phase_switch

# --- bench9b: the same for Gemma-2 9B shapes, where an H100/H200 step is bound by bytes ---------
phase_bench9b() {
    bench_llama 9b "$work/bench-9b.json"
}
# estimates (not yet seen on a GPU): llama-bench ~90 s; a 9B q8_0 file ~45 s to write (9.8 GB),
# a q4_0 one ~45 s more to quantize
bench9b_need=90
for t in $bench_types; do
    for p in spark-gemma2-9b gemma2-9b; do [ -f "$work/models/$p-$t.gguf" ] || bench9b_need=$((bench9b_need + 45)); done
done
run_phase bench9b "$bench9b_need" phase_bench9b

# --- prof --------------------------------------------------------------------------------------
phase_prof() {
    mkdir -p "$work/prof"
    local copy
    copy=$(python3 - <<'EOF' 2>"$logs/copy-bw.log"
import torch
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20):
    b.copy_(a)
e.record()
torch.cuda.synchronize()
print(f"{2 * n * 20 / (s.elapsed_time(e) / 1e3) / 1e9:.0f}")
EOF
    )
    say "device-to-device copy: ${copy:-?} GB/s (bytes read + written, 1 GiB buffers, PyTorch)"
    local model=$work/models/spark-gemma2-2b-q8_0.gguf
    [ -f "$model" ] || model=$(find "$work/models" -name 'spark-gemma2-2b-*.gguf' | head -1)
    [ -n "$model" ] || { say "no synthetic Spark 2B model (bench makes them)"; return 1; }
    say "profiled: llama-bench -m $(basename "$model") -ngl 99 -fa 0 -p 0 -n 16 -d 512 -r 1 --no-warmup"
    local nsys_bin
    nsys_bin=$(command -v nsys || find /opt/nvidia /usr/local/cuda/bin -path '*nsight-systems*/bin/nsys' 2>/dev/null | head -1)
    if [ -n "$nsys_bin" ] && GGML_BACKEND_PATH=$plugin timeout "$(( $(left) - 10 ))" "$nsys_bin" profile \
            -o "$work/prof/spark" --force-overwrite true -t cuda "$bin/llama-bench" -m "$model" -ngl 99 \
            -fa 0 -p 0 -n 16 -d 512 -r 1 --no-warmup >"$logs/nsys.log" 2>&1 \
            && "$nsys_bin" stats -r cuda_gpu_kern_sum -f csv -o "$work/prof/kern" "$work/prof/spark.nsys-rep" \
            >>"$logs/nsys.log" 2>&1; then
        say "nsys: per-kernel sums (all kernels; Spark ones start with spark_):"
        head -n 25 "$work"/prof/kern*.csv | emit
    else
        [ -n "$nsys_bin" ] && say "nsys at $nsys_bin did not make a report (logs/nsys.log); using ncu"
        if ! command -v ncu >/dev/null; then
            say "neither nsys nor ncu works here: no per-kernel times"; return 0
        fi
        GGML_BACKEND_PATH=$plugin timeout "$(( $(left) - 10 ))" ncu --kernel-name regex:'^spark_' \
            --launch-count 800 --clock-control none --cache-control all \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size \
            --csv --page raw --print-units base \
            "$bin/llama-bench" -m "$model" -ngl 99 -fa 0 -p 0 -n 16 -d 512 -r 1 --no-warmup \
            >"$work/prof/ncu.csv" 2>"$logs/ncu.log" || say "ncu ended with an error (logs/ncu.log)"
        python3 - "$work/prof/ncu.csv" "${copy:-0}" <<'EOF' | emit
import csv, collections, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1], errors="replace") if l.startswith('"'))]
copy = float(sys.argv[2] or 0)
if not rows:
    print("ncu: no Spark kernel profiled"); sys.exit(0)
h = rows[0]
keys = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "launch__grid_size")
ix = {k: h.index(k) for k in ("Kernel Name",) + keys}
# one row per kernel and grid size: the depth-512 prefill (one 512-token ubatch) and the decode
# steps launch the same kernels with different grids
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for r in rows[1:]:
    try:
        t, rd, wr, grid = (float(r[ix[k]].replace(",", "")) for k in keys)
    except (ValueError, IndexError):
        continue  # the units row
    a = agg[f"{r[ix['Kernel Name']].split('(')[0]} (grid {grid:.0f})"]
    a[0] += 1; a[1] += t; a[2] += rd; a[3] += wr
print("ncu (serialized, caches flushed before each kernel, clocks not locked):")
print("| kernel (blocks) | launches | mean us | mean MB read | mean MB written | GB/s read+written | % of copy |")
print("|---|---|---|---|---|---|---|")
for k, (n, t, rd, wr) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    gbs = (rd + wr) / t if t else 0  # bytes per ns = GB/s
    pct = f"{100 * gbs / copy:.0f} %" if copy else "?"
    print(f"| {k} | {n} | {t / n / 1e3:.1f} | {rd / n / 1e6:.2f} | {wr / n / 1e6:.2f} | {gbs:.0f} | {pct} |")
EOF
    fi
    return 0
}
if [[ " ${skipped[*]} " == *" bench "* ]] && [ ! -f "$work/sections/prof.done" ]; then
    # the profile runs on bench's synthetic 2B model
    has_phase prof && { say "== prof: SKIPPED with bench (it profiles bench's 2B model)"; skipped+=(prof); }
else
    run_phase prof 120 phase_prof
fi

# --- batched and scaling: tools/bench-batched.sh and tools/bench-scaling.sh on this build -------
# Both scripts take an upstream-like folder (bin/, lib/libggml-spark.so) and bench_models' Q8_0
# pair, which are bench's q8_0 models.
upstream_dir() {
    mkdir -p "$work/upstream/lib"
    ln -sfn "$bin" "$work/upstream/bin"
    ln -sfn "$plugin" "$work/upstream/lib/libggml-spark.so"
}

phase_batched() {
    upstream_dir
    say "tools/bench-batched.sh -npl 1,4,16 -npp 128 -ntg 128 -- -ngl 99 (llama-batched-bench, Spark vs stock, q8_0)"
    SPARK_CONVERT=$convert timeout "$(( $(left) - 10 ))" bash tools/bench-batched.sh -npl 1,4,16 \
        -npp 128 -ntg 128 -t "$threads" --upstream "$work/upstream" --models "$work/models" \
        --out "$logs/batched" -- -ngl 99 2>"$logs/batched.log" | emit \
        || { tail -n 5 "$logs/batched.log" | emit; fail "batched: bench-batched.sh failed (logs/batched.log)"; return 1; }
}
run_phase batched 90 phase_batched

phase_scaling() {
    upstream_dir
    say "CPU only (CUDA_VISIBLE_DEVICES=): tools/bench-scaling.sh -t 4,8,16 -p 0 -n 64 -d 512 -r 2 (llama-bench, q8_0)"
    say "the CPU backend of this build: $(if [ -f "$bld/BUILT_ON" ]; then echo 'portable x86-64-v3 (prebuilt)'; else echo '-march=native'; fi)"
    CUDA_VISIBLE_DEVICES= SPARK_CONVERT=$convert timeout "$(( $(left) - 10 ))" bash tools/bench-scaling.sh \
        -t 4,8,16 -p 0 -n 64 -d 512 -r 2 --upstream "$work/upstream" --models "$work/models" -o json \
        >"$work/scaling.json" 2>"$logs/scaling.log" \
        || { tail -n 5 "$logs/scaling.log" | emit; fail "scaling: bench-scaling.sh failed or ran out of time (logs/scaling.log)"; return 1; }
    bench_table "$work/scaling.json" | emit
}
run_phase scaling 150 phase_scaling

# --- gemma3n: Gemma 3n's sparse layers on the GPU (issue 43 item 5) ---------------------------
# tools/gemma3n-synth.py's Gemma 3n (GPU_CHECK_GEMMA3N_PRESET: tiny, the default, or e2b for the
# real E2B text model's shapes, ~4.7 GB in q8_0), made here with numpy and the carry's gguf
# wheel, every layer on the GPU: llama-completion's greedy text with the plugin must equal
# upstream's gemma3n graph (the same binary without the plugin; f32, as
# tests/python/gemma3n/test_sparse_ffn.py checks on the CPU), the plugin's table must have rows
# for layers 0-9 only (its kernels ran) and GGML_SCHED_DEBUG=2 every custom node on CUDA; then
# llama-bench -p 512 -n 128 of the q8_0 file with and without the plugin, and their ratio (the
# tiny model is bound by launches: the ratio says what the plugin costs per layer, not what a
# real E2B gains).
gemma3n_model() {
    local t=$1 preset=${GPU_CHECK_GEMMA3N_PRESET:-tiny}
    local out=$work/models/gemma3n-$preset-$t.gguf
    [ -f "$out" ] || PYTHONPATH="$work/gguf-py${PYTHONPATH:+:$PYTHONPATH}" python3 "$root/tools/gemma3n-synth.py" \
        "$preset" "$out" --outtype "$t" --seed 1 --quiet >>"$logs/gemma3n-synth.log" 2>&1 \
        || { rm -f "$out"; fail "gemma3n: tools/gemma3n-synth.py $preset $t failed (logs/gemma3n-synth.log)"; return 1; }
    echo "$out"
}

phase_gemma3n() {
    local wheel f32 q8 prompt="First Citizen: Before we proceed any further, hear me speak."
    wheel=$(ls "$carry"/gguf-*.whl 2>/dev/null | head -1)
    [ -d "$work/gguf-py/gguf" ] || python3 -m zipfile -e "$wheel" "$work/gguf-py" \
        || { fail "gemma3n: cannot unpack the carry's gguf wheel"; return 1; }
    f32=$(gemma3n_model f32) && q8=$(gemma3n_model q8_0) || return 1
    local run=("$bin/llama-completion" -m "$f32" -p "$prompt" -n 24 --temp 0 --seed 1 -t "$threads"
               -no-cnv --no-display-prompt --no-warmup -ngl 99)
    timeout 120 "${run[@]}" >"$logs/gemma3n-stock.txt" 2>"$logs/gemma3n-stock.log" \
        || { fail "gemma3n: llama-completion without the plugin failed (logs/gemma3n-stock.log)"; return 1; }
    GGML_BACKEND_PATH=$plugin SPARK_STATS=1 GGML_SCHED_DEBUG=2 timeout 120 "${run[@]}" -v \
        >"$logs/gemma3n-spark.txt" 2>"$logs/gemma3n-spark.log" \
        || { fail "gemma3n: llama-completion with the plugin failed (logs/gemma3n-spark.log)"; return 1; }
    if cmp -s "$logs/gemma3n-stock.txt" "$logs/gemma3n-spark.txt"; then
        say "gemma3n f32 -ngl 99: the same text with the plugin as upstream's graph: $(head -c 80 "$logs/gemma3n-spark.txt" | tr '\n' ' ')"
    else
        fail "gemma3n: f32 text with the plugin differs from upstream's graph (logs/gemma3n-{spark,stock}.txt)"
    fi
    local rows
    rows=$(stats_table "$logs/gemma3n-spark.log" | awk '{print $1}' | tr '\n' ' ')
    say "gemma3n: the plugin's table has rows for layers: ${rows:-none}"
    [ "$rows" = "0 1 2 3 4 5 6 7 8 9 " ] || fail "gemma3n: the table's rows are '${rows:-none}', want layers 0-9"
    sched_check gemma3n "$logs/gemma3n-spark.log"
    local reps=${GPU_CHECK_BENCH_REPS:-3} with
    for with in no yes; do
        local env_plugin=()
        [ "$with" = yes ] && env_plugin=(GGML_BACKEND_PATH="$plugin")
        env "${env_plugin[@]}" timeout "$(( $(left) - 10 ))" "$bin/llama-bench" -m "$q8" -ngl 99 -fa 0 \
            -p 512 -n 128 -r "$reps" -o json >"$work/gemma3n-bench-$with.json" 2>"$logs/gemma3n-bench-$with.log" \
            || { fail "gemma3n: llama-bench (plugin $with) failed (logs/gemma3n-bench-$with.log)"; return 1; }
    done
    python3 - "$work/gemma3n-bench-no.json" "$work/gemma3n-bench-yes.json" <<'EOF' | emit
import json, sys
stock, spark = (json.load(open(p)) for p in sys.argv[1:3])
print("| test | stock t/s | with the plugin t/s | ratio |")
print("|---|---|---|---|")
for a, b in zip(stock, spark):
    test = f"pp{a['n_prompt']}" if a["n_prompt"] else f"tg{a['n_gen']}"
    print(f"| {test} | {a['avg_ts']:.2f} | {b['avg_ts']:.2f} | **{b['avg_ts'] / a['avg_ts']:.2f}x** |")
EOF
}
run_phase gemma3n 90 phase_gemma3n

# --- verdict -----------------------------------------------------------------------------------
say ""
say "== verdict ($((SECONDS - start)) s)"
save_logs
if [ "${#failures[@]}" -gt 0 ]; then
    say "FAILED: ${#failures[@]} check(s):"
    for f in "${failures[@]}"; do say "  - $f"; done
    exit 1
fi
if [ "${#skipped[@]}" -gt 0 ]; then
    say "INCOMPLETE: skipped for time: ${skipped[*]}; run the same command again (the machine keeps target/gpuwork while warm)"
    exit 2
fi
say "PASSED"
