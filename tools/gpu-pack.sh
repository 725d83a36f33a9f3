#!/usr/bin/env bash
# Packs what tools/gpu-check.sh needs on the lent GPU machine (CUDA 13.0, CMake, no Rust, no
# network) into target/gpucarry (ignored; carried by the `run` call, see tools/README.md):
#
#   llama-src.tar.gz   the patched llama.cpp tree, `tools/llama-tree.sh --tools`: the pinned
#                      crate's sources, the project's new files, the series, and tools/ from the
#                      pinned PyPI sdist that tools/upstream.sh uses
#   libggml-spark.so   the plugin: cargo build --release -p spark-backend --features cuda, for
#                      x86-64-v3 in target/gpupack/cargo (not the workspace's target-cpu=native)
#   spark-convert      converts the shipped model and writes synthetic 2B models there
#   series-tag         the series tag (spark-<12 hex>, = spark_llama_prep::SERIES_TAG) that the
#                      device build passes as GGML_BUILD_COMMIT_OVERRIDE; the plugin must carry it
#   MANIFEST           versions, tag, commit, sizes
#   llama-cuda-smARCH.tar.xz  with --cuda-arch ARCH only: the patched llama.cpp built here with
#                      GGML_CUDA=ON for that architecture alone (the PyPI nvcc of cuda-tools.sh,
#                      tools/gpu-check.sh's cmake options, a portable x86-64-v3 CPU backend):
#                      the tools and shared libraries, stripped, RPATH $ORIGIN. gpu-check.sh
#                      uses it when it loads there, so the lent minutes go to checks, not to
#                      compiling (~4 min there; here ~1 h on 2 cores the first time, then
#                      incremental)
#
# The shipped model needs no carrying: models/spark-shakespeare.npz travels with the working
# tree and gpu-check.sh converts it there. The binaries built here (Debian 12, glibc 2.36) run on
# the device (Ubuntu 24.04, glibc 2.39, newer libstdc++); the script checks the symbol versions.
#
# Usage: bash tools/gpu-pack.sh [--no-build] [--plugin SO] [--convert BIN] [--cuda-arch ARCH]
#   --no-build     do not run cargo: take the plugin and spark-convert from target/gpupack/cargo
#   --plugin SO    pack this plugin library instead (no cargo build; it must carry the tag)
#   --convert BIN  pack this spark-convert instead (no cargo build)
#   --cuda-arch ARCH  also prebuild the CUDA llama.cpp for this architecture (90: H100/H200)
# Runs cargo build --release (the first time with a changed series it recompiles llama.cpp:
# 10-15 min on 2 cores); the packing itself takes ~20 s.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

build=1 plugin='' convert='' cuda_arch=''
patch_dir=$root/patches/llama.cpp
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --plugin) plugin=$(realpath "$2"); shift ;;
        --convert) convert=$(realpath "$2"); shift ;;
        --cuda-arch) cuda_arch=$2; shift
                     [[ "$cuda_arch" =~ ^[0-9]+a?$ ]] || { echo "gpu-pack: --cuda-arch takes a number such as 90" >&2; exit 2; } ;;
        -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-pack: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
say() { echo "gpu-pack: $*"; }
die() { echo "gpu-pack: error: $*" >&2; exit 1; }

carry=$root/target/gpucarry
work=$root/target/gpupack
mkdir -p "$carry" "$work"

# 1. The series tag, as spark-llama-prep computes it (tools/llama-tree.sh --tag), and the pins
#    the manifest names.
tag=$(bash tools/llama-tree.sh --tag)
version=$(sed -n 's/^const SYS_VERSION: &str = "\(.*\)";/\1/p' patches/spark-llama-prep/build.rs)
pin() { sed -n "s/^$1=//p" tools/upstream.sh | head -1; }
sdist_name=$(pin SDIST_NAME) sdist_version=$(pin SDIST_VERSION)
say "series: $(find "$patch_dir" -maxdepth 1 -name '*.patch' | wc -l) patches, tag $tag"

# 2. The plugin and spark-convert, for a CPU nobody here has seen: the workspace builds for
#    target-cpu=native (.cargo/config.toml), which may use instructions (AVX-512, AMX) the GPU
#    machine's CPU lacks; these are built for x86-64-v3 (AVX2, FMA, F16C, BMI2: the plugin's
#    fastest kernels) in their own target directory. Two cargo calls: one call with
#    `-p spark-backend -p spark-convert --features spark-backend/cuda` once gave a plugin without
#    the feature (2026-11-27).
cargo_dir=$work/cargo
if [ "$build" = 1 ] && [ -z "$plugin$convert" ]; then
    say "cargo build --release -p spark-backend --features cuda; -p spark-convert (x86-64-v3, $cargo_dir)"
    export CARGO_TARGET_DIR=$cargo_dir RUSTFLAGS="-C target-cpu=x86-64-v3"
    cargo build --release -p spark-backend --features cuda || die "cargo build of the plugin failed (see above)"
    cargo build --release -p spark-convert || die "cargo build of spark-convert failed (see above)"
    unset CARGO_TARGET_DIR RUSTFLAGS
    plugin=$cargo_dir/release/libspark_backend.so
    convert=$cargo_dir/release/spark-convert
fi
[ -n "$plugin" ] || plugin=$cargo_dir/release/libspark_backend.so
[ -n "$convert" ] || convert=$cargo_dir/release/spark-convert
[ -f "$plugin" ] || die "plugin not found: $plugin"
[ -x "$convert" ] || die "spark-convert not found: $convert"
built_tag=$(grep -a -o 'spark-[0-9a-f]\{12\}' "$plugin" | sort -u | tr '\n' ' ' | sed 's/ $//')
[ "$built_tag" = "$tag" ] \
    || die "$plugin was built against '${built_tag:-no tag}', the series is $tag (build it again)"
# NVRTC's entry points are named only where the `cuda` feature compiled cudarc in (the hook's
# proc name is in every build)
cuda_feature=no
if grep -a -q 'nvrtcCompileProgram' "$plugin"; then cuda_feature=yes; fi
[ "$cuda_feature" = yes ] || die "$plugin has no CUDA launchers (built without --features cuda)"

# The device runs glibc 2.39 and Ubuntu 24.04's libstdc++ (GLIBCXX_3.4.33).
for f in "$plugin" "$convert"; do
    glibc=$(objdump -T "$f" | { grep -o 'GLIBC_2\.[0-9]*' || true; } | sort -t. -k2 -n -u | tail -1)
    glibcxx=$(objdump -T "$f" | { grep -o 'GLIBCXX_3\.4\.[0-9]*' || true; } | sort -t. -k3 -n -u | tail -1)
    say "$(basename "$f"): needs ${glibc:-no glibc symbols} ${glibcxx:-(no libstdc++)}"
    [ -z "$glibc" ] || [ "${glibc#GLIBC_2.}" -le 39 ] || die "$f needs $glibc (device: 2.39)"
    [ -z "$glibcxx" ] || [ "${glibcxx#GLIBCXX_3.4.}" -le 33 ] || die "$f needs $glibcxx"
done

# 3. The patched source tree with the tools' sources (tools/llama-tree.sh --tools).
stage=$work/stage
rm -rf "$stage"
bash tools/llama-tree.sh --tools "$stage" || die "tools/llama-tree.sh could not make the tree"
printf '%s\n' "$tag" >"$stage/llama.cpp/SPARK_SERIES_TAG"
# Leave out what a CUDA build of the libraries and tools never reads (vocab test files, docs,
# Python, CI, tests, examples, the server's web UI).
tar -C "$stage" -czf "$carry/llama-src.tar.gz.tmp" \
    --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/gguf-py \
    --exclude=llama.cpp/ci --exclude=llama.cpp/tests --exclude=llama.cpp/examples \
    --exclude=llama.cpp/pocs --exclude=llama.cpp/tools/ui --exclude='*.py' llama.cpp
mv -f "$carry/llama-src.tar.gz.tmp" "$carry/llama-src.tar.gz"
rm -rf "$stage"
# gguf-py, the .venv's version as a wheel (pure Python; the GPU machine has numpy, PyYAML and
# tqdm): tools/predict-ratio.py reads the bench models' tensors with it there
gguf_version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gguf"))') \
    || die "no gguf in .venv: run bash tools/setup.sh"
rm -f "$carry"/gguf-*.whl
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: "gguf==$gguf_version" -d "$carry" \
    || die "pip could not download gguf==$gguf_version"

# 4. The binaries (symbols stripped; the plugin keeps its dynamic symbols) and the manifest.
rm -f "$carry/llama-src.tgz"   # an earlier session's name for the source tarball
strip -o "$carry/libggml-spark.so" "$plugin"
strip -o "$carry/spark-convert" "$convert"
printf '%s\n' "$tag" >"$carry/series-tag"
{
    echo "series_tag $tag"
    echo "llama_cpp_sys_2 $version"
    echo "patches $(find "$patch_dir" -maxdepth 1 -name '*.patch' | wc -l)"
    echo "tools_sdist $sdist_name==$sdist_version"
    echo "project_commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- spark-backend patches 2>/dev/null || echo '+dirty')"
    echo "plugin_cuda_launchers $cuda_feature"
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$carry/MANIFEST"

# 5. The prebuilt CUDA llama.cpp (--cuda-arch): gpu-check.sh's own build phase, run here.
rm -f "$carry"/llama-cuda-sm*.tar.xz
if [ -n "$cuda_arch" ]; then
    bash tools/cuda-tools.sh --quiet
    # shellcheck source=/dev/null
    source target/cuda-tools/env.sh
    pre=$root/target/gpuprebuild
    say "building the CUDA llama.cpp for sm_$cuda_arch in $pre (log: $pre/logs/cmake-build.log)"
    GPU_CHECK_WORK=$pre GPU_CHECK_PREBUILD=1 CUDA_ARCH=$cuda_arch OUT=$pre/out \
        bash tools/gpu-check.sh --phases build --budget 100000 --redo >"$work/prebuild.log" 2>&1 \
        || { tail -n 30 "$work/prebuild.log" >&2; die "the CUDA build failed"; }
    stage=$work/prebuilt
    rm -rf "$stage"
    mkdir -p "$stage/bin"
    # the tools gpu-check.sh's build phase made (its tools_built)
    for t in "$pre"/build/bin/llama-*; do
        [ -x "$t" ] && [ -f "$t" ] && strip -o "$stage/bin/$(basename "$t")" "$t"
    done
    # the shared libraries with their soname links; strip only the files
    (cd "$pre/build/bin" && find . -maxdepth 1 -name '*.so*' -print0 | xargs -0 cp -P -t "$stage/bin")
    find "$stage/bin" -name '*.so*' -type f -exec strip --strip-unneeded {} +
    printf '%s\n' "$tag" >"$stage/SPARK_SERIES_TAG"
    echo "$(hostname) $(date -u +%Y-%m-%dT%H:%M:%SZ), nvcc $("$SPARK_NVCC" --version | grep -o 'release [0-9.]*'), sm_$cuda_arch, x86-64-v3 CPU backend" \
        >"$stage/BUILT_ON"
    tar -C "$stage" -cJf "$carry/llama-cuda-sm$cuda_arch.tar.xz" SPARK_SERIES_TAG BUILT_ON bin
    rm -rf "$stage"
    echo "prebuilt llama-cuda-sm$cuda_arch.tar.xz" >>"$carry/MANIFEST"
fi

size=$(du -sb "$carry" | cut -f1)
tree_size=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | xargs -0 du -cb 2>/dev/null | awk '/\ttotal$/ {s += $1} END {print s + 0}')
say "target/gpucarry: $((size / 1024 / 1024)) MiB; working tree: $((tree_size / 1024 / 1024)) MiB (the run call's limit: 64 MiB together)"
find "$carry" -maxdepth 1 -type f -printf 'gpu-pack:   %10s  %f\n' | sort -k3
[ "$size" -lt $((60 * 1024 * 1024)) ] || die "target/gpucarry is over 60 MiB"
[ $((size + tree_size)) -lt $((64 * 1024 * 1024)) ] || die "working tree + carry is over 64 MiB"
