#!/usr/bin/env bash
# The Spark plugin beside llama.cpp's Vulkan backend (issue 43, item 6: other GPU backends stay
# out of the way), on Mesa's CPU Vulkan driver (lavapipe), with no GPU:
#
#   target/vulkan/tree/llama.cpp   the patched tree with upstream's tools (tools/llama-tree.sh
#                                  --tools), once per series tag
#   target/vulkan/headers          Debian 13's Vulkan headers (Debian 12's are too old for
#                                  ggml-vulkan), unpacked from its pinned libvulkan-dev package
#   target/vulkan/build            its cmake build with GGML_VULKAN=ON (GGML_BUILD_COMMIT_OVERRIDE =
#                                  the series tag, which the plugin checks; shared libraries,
#                                  no CUDA), llama-completion and llama-perplexity only
#
# Then runs tests/python/gemma3n/test_vulkan.py with SPARK_VULKAN_BIN pointing at that build:
# a tiny Gemma 3n with every layer on Vulkan0 gives the same text with the plugin as without,
# its sparse layers keep upstream's graph there (one load line; no Spark kernel runs on the CPU;
# GGML_SCHED_DEBUG shows as many graph splits as without the plugin), and a spark-gemma2 file
# names the layers whose Spark nodes run on the CPU. Needs Debian's glslc, libvulkan-dev,
# spirv-headers and mesa-vulkan-drivers (`apt-get install glslc libvulkan-dev spirv-headers
# mesa-vulkan-drivers`; the script
# says so when one is missing) and what tools/upstream.sh installs (the plugin, the pinned
# sdist). Not part of CI: this is a second llama.cpp build (about 15 minutes on 2 cores the
# first time, most of it ggml-vulkan's shaders), which CI's time does not hold; docs/USAGE.md,
# "Other GPU backends", has its last result.
#
# Usage: bash tools/vulkan-check.sh [--build-only] [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/target/vulkan
build_only=0
case "${1:-}" in  # the first argument only; the others go to pytest
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
say() { echo "vulkan-check: $*"; }
die() { echo "vulkan-check: error: $*" >&2; exit 1; }

missing=()
command -v glslc >/dev/null || missing+=(glslc)
[ -f /usr/include/vulkan/vulkan.hpp ] || missing+=(libvulkan-dev)
[ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ] || missing+=(spirv-headers)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
[ ${#missing[@]} = 0 ] || die "missing Debian packages: apt-get install ${missing[*]}"
plugin=$root/target/upstream/lib/libggml-spark.so
[ -f "$plugin" ] || die "$plugin is missing: run bash tools/upstream.sh first"
tag=$(bash tools/llama-tree.sh --tag)
grep -qaF "$tag" "$plugin" || die "$plugin was built for another series than $tag: run bash tools/upstream.sh first"

# 1. The patched tree with upstream's tools, once per series tag.
if [ "$(cat "$out/tree.tag" 2>/dev/null)" != "$tag" ]; then
    say "patched tree $tag"
    rm -rf "$out/tree" "$out/build" "$out/tree.tag"
    mkdir -p "$out"
    bash tools/llama-tree.sh --tools "$out/tree" 2>&1 | sed 's/^/vulkan-check: /'
    echo "$tag" >"$out/tree.tag"
fi
tree=$out/tree/llama.cpp

# 2. Vulkan headers new enough for ggml-vulkan (vk::LayerSettingEXT, Vulkan 1.3.261+): Debian 12's
#    libvulkan-dev has 1.3.239, so Debian 13's package is unpacked here (headers only; the
#    loader stays Debian 12's libvulkan1), pinned by its sha256.
HEADERS_DEB=libvulkan-dev_1.4.309.0-1_amd64.deb
HEADERS_URL=http://deb.debian.org/debian/pool/main/v/vulkan-loader/$HEADERS_DEB
HEADERS_SHA256=8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a
headers=$out/headers/usr/include
if [ ! -f "$headers/vulkan/vulkan.hpp" ]; then
    say "Vulkan headers 1.4.309 (Debian 13's $HEADERS_DEB)"
    mkdir -p "$out/dl"
    [ -f "$out/dl/$HEADERS_DEB" ] || curl -fsSL -o "$out/dl/$HEADERS_DEB" "$HEADERS_URL" \
        || die "cannot download $HEADERS_URL"
    echo "$HEADERS_SHA256  $out/dl/$HEADERS_DEB" | sha256sum -c --quiet - \
        || die "$out/dl/$HEADERS_DEB: sha256 differs from the pinned one"
    rm -rf "$out/headers"
    dpkg-deb -x "$out/dl/$HEADERS_DEB" "$out/headers"
    [ -f "$headers/vulkan/vulkan.hpp" ] || die "no vulkan/vulkan.hpp in $HEADERS_DEB"
fi

# 3. llama.cpp with the Vulkan backend.
if [ ! -f "$out/build/CMakeCache.txt" ]; then
    say "configuring llama.cpp with GGML_VULKAN=ON"
    cmake -S "$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$headers" -DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DGGML_BACKEND_DL=OFF \
        -DGGML_BUILD_COMMIT_OVERRIDE="$tag" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$out/configure.log" 2>&1 \
        || { tail -n 30 "$out/configure.log" >&2; die "cmake configure failed (see above)"; }
fi
say "building llama-completion and llama-perplexity with Vulkan (about 15 minutes the first time)"
cmake --build "$out/build" -j "$(nproc)" --target llama-completion llama-perplexity >"$out/build.log" 2>&1 \
    || { tail -n 30 "$out/build.log" >&2; die "build failed ($out/build.log)"; }
bin=$out/build/bin
for t in llama-completion llama-perplexity; do
    [ -x "$bin/$t" ] || die "no $bin/$t after the build"
done
grep -qaF "$tag" "$bin/libggml-base.so" || die "$bin/libggml-base.so does not carry the series tag $tag"
say "llama-completion with Vulkan: $bin/llama-completion"
[ "$build_only" = 0 ] || exit 0

# 4. The test.
export SPARK_VULKAN_BIN=$bin
exec "$root/.venv/bin/python" -m pytest -q -s tests/python/gemma3n/test_vulkan.py "$@"
