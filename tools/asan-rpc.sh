#!/usr/bin/env bash
# The RPC fuzz test (tests/python/upstream/test_rpc_fuzz.py) against an rpc-server built with
# AddressSanitizer: ggml (libggml, -base, -cpu, -rpc) of the patched tree with
# GGML_SANITIZE_ADDRESS, upstream's tools/rpc/rpc-server.cpp compiled with -fsanitize=address
# against it, and the plugin built with `-Zsanitizer=address`. That flag is unstable: the
# script uses `cargo +nightly` when a nightly toolchain is installed, else the stable one with
# RUSTC_BOOTSTRAP=1 (rustup's x86_64 toolchains ship the ASan runtime, librustc-*_rt.asan.a;
# the standard library stays uninstrumented, hence -Cunsafe-allow-abi-mismatch=sanitizer).
# The plugin finds this ggml by soname (the ASan libraries are loaded first) and calls the ASan
# runtime of the server, so every read and write of ggml, ggml-rpc (message parsing, tensor
# copies, stock ops) and the Spark kernels is checked. With --normal-plugin the server loads
# the normal plugin (target/upstream/lib/libggml-spark.so): ASan then still checks ggml and
# ggml-rpc and reports any fault in the process, but not the plugin's own out-of-bounds reads
# and writes.
#
#   target/asan-rpc/tree/llama.cpp   the patched tree (tools/llama-tree.sh), once per series tag
#   target/asan-rpc/build            cmake build of ggml with ASan (GGML_BUILD_COMMIT_OVERRIDE =
#                                    the series tag, which the plugin checks; GGML_NATIVE,
#                                    RelWithDebInfo, shared, RPC: the cargo build's settings)
#   target/asan-rpc/bin/rpc-server   the server (run path: the build's libraries)
#   target/asan-plugin               cargo's target directory of the ASan plugin (its own
#                                    llama.cpp build: ~7 min on 2 cores the first time)
#
# Then runs the test with SPARK_FUZZ_RPC_SERVER and SPARK_FUZZ_PLUGIN pointing there (the client
# tools of the test keep the installed build), and ASAN_OPTIONS that make the server behave as
# the normal build where a hostile client asks for an impossible allocation
# (allocator_may_return_null: ggml-rpc answers "no buffer", as with glibc's malloc) and leave
# leak reports out (the test ends servers with SIGTERM). An ASan report ends the server and
# fails the test, except where a case expects one of the upstream crashes the test lists. Needs
# what tools/upstream.sh installs (llama-completion for the final --rpc text, the pinned sdist
# of the tools' sources). About 6 minutes on 2 cores for ggml and 7 for the plugin (its own
# llama.cpp build) the first time, seconds when nothing changed; the test itself takes about
# as long as on the normal build. Not part of CI (tests/run.sh runs the test against the normal
# build: CI's time does not hold two more llama.cpp builds); patches/README.md,
# "Hostile RPC clients: the last runs", has its last result.
#
# Usage: bash tools/asan-rpc.sh [--build-only] [--normal-plugin] [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/target/asan-rpc
build_only=0
asan_plugin=1
while [ $# -gt 0 ]; do
    case "$1" in
        --build-only) build_only=1 ;;
        --normal-plugin) asan_plugin=0 ;;
        -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) break ;;
    esac
    shift
done
say() { echo "asan-rpc: $*"; }
die() { echo "asan-rpc: error: $*" >&2; exit 1; }

plugin=$root/target/upstream/lib/libggml-spark.so
[ -f "$plugin" ] || die "$plugin is missing: run bash tools/upstream.sh first"
pin() { sed -n "s/^$1=//p" tools/upstream.sh | head -1; }
sdist=$root/target/upstream/dl/$(pin SDIST_NAME | tr - _)-$(pin SDIST_VERSION)/llama.cpp
server_src=$sdist/tools/rpc/rpc-server.cpp
[ -f "$server_src" ] || die "$server_src is missing: run bash tools/upstream.sh first"
tag=$(bash tools/llama-tree.sh --tag)
grep -qaF "$tag" "$plugin" || die "$plugin was built for another series than $tag (the \
plugin refuses a ggml of another tag): run bash tools/upstream.sh first"

# 1. The patched tree, once per series tag.
if [ "$(cat "$out/tree.tag" 2>/dev/null)" != "$tag" ]; then
    say "patched tree $tag"
    rm -rf "$out/tree" "$out/build" "$out/bin" "$out/tree.tag"
    mkdir -p "$out"
    bash tools/llama-tree.sh "$out/tree" 2>&1 | sed 's/^/asan-rpc: /'
    echo "$tag" >"$out/tree.tag"
fi
tree=$out/tree/llama.cpp

# 2. ggml with ASan: the tree's cmake project without llama's tools, common, tests and
#    examples, and only the ggml target built (rpc-server links nothing else).
if [ ! -f "$out/build/CMakeCache.txt" ]; then
    say "configuring ggml with AddressSanitizer"
    cmake -S "$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
        -DGGML_BACKEND_DL=OFF -DGGML_SANITIZE_ADDRESS=ON -DLLAMA_SANITIZE_ADDRESS=ON \
        -DGGML_BUILD_COMMIT_OVERRIDE="$tag" -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF >"$out/configure.log" 2>&1 \
        || { tail -n 30 "$out/configure.log" >&2; die "cmake configure failed (see above)"; }
fi
say "building ggml with AddressSanitizer (a few minutes the first time)"
cmake --build "$out/build" -j "$(nproc)" --target ggml >"$out/build.log" 2>&1 \
    || { tail -n 30 "$out/build.log" >&2; die "ggml build failed ($out/build.log)"; }
libdir=$(dirname "$(find "$out/build" -name 'libggml-base.so' -print -quit)")
[ -f "$libdir/libggml-rpc.so" ] || die "no libggml-rpc.so next to libggml-base.so in $libdir"

# 3. rpc-server, as tools/rpc/CMakeLists.txt builds it (C++17, linked to ggml), with ASan.
mkdir -p "$out/bin"
if [ ! -x "$out/bin/rpc-server" ] || [ "$server_src" -nt "$out/bin/rpc-server" ] \
        || [ -n "$(find "$libdir" -name 'libggml*.so*' -newer "$out/bin/rpc-server")" ]; then
    say "compiling rpc-server with AddressSanitizer"
    ${CXX:-g++} -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer \
        -I"$tree/ggml/include" "$server_src" -L"$libdir" -lggml -lggml-base \
        -Wl,-rpath,"$libdir" -pthread -o "$out/bin/rpc-server"
fi
grep -qaF "$tag" "$libdir/libggml-base.so" \
    || die "$libdir/libggml-base.so does not carry the series tag $tag"
[ "$(ldd "$out/bin/rpc-server" | grep -c libasan)" -gt 0 ] \
    || die "$out/bin/rpc-server is not linked to libasan"
say "rpc-server with ASan: $out/bin/rpc-server (ggml $tag, libraries in $libdir)"

# 4. The plugin with ASan, in a target directory of its own. --target keeps RUSTFLAGS off the
#    build scripts (they run here, without the ASan runtime).
toolchain=()
if cargo +nightly --version >/dev/null 2>&1; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1  # the stable toolchain takes -Z flags (module docs)
fi
if [ "$asan_plugin" = 1 ]; then
    host=$(rustc -vV | sed -n 's/^host: //p')
    pdir=$root/target/asan-plugin
    say "building the plugin with -Zsanitizer=address (cargo ${toolchain[*]:-with RUSTC_BOOTSTRAP}; ~7 min the first time)"
    CARGO_TARGET_DIR=$pdir RUSTFLAGS="-Zsanitizer=address -Cunsafe-allow-abi-mismatch=sanitizer" \
        cargo "${toolchain[@]}" build -p spark-backend --target "$host" >"$out/plugin-build.log" 2>&1 \
        || { tail -n 30 "$out/plugin-build.log" >&2; die "plugin build failed (see above)"; }
    plugin=$pdir/$host/debug/libspark_backend.so
    # (grep -c reads all of nm's output: grep -q would end the pipe early: a failure)
    [ "$(nm -D "$plugin" | grep -c __asan_init)" -gt 0 ] \
        || die "$plugin has no ASan instrumentation"
    grep -qaF "$tag" "$plugin" || die "$plugin was not built for $tag"
    export SPARK_FUZZ_PLUGIN=$plugin
    say "plugin with ASan: $plugin"
fi
[ "$build_only" = 0 ] || exit 0

# 5. The fuzz test against them.
export SPARK_FUZZ_RPC_SERVER=$out/bin/rpc-server
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=0:abort_on_error=1}
say "SPARK_FUZZ_RPC_SERVER=$SPARK_FUZZ_RPC_SERVER ASAN_OPTIONS=$ASAN_OPTIONS"
exec "$root/.venv/bin/python" -m pytest -q -s tests/python/upstream/test_rpc_fuzz.py "$@"
