#!/usr/bin/env bash
# Cross-builds Spark for 64-bit ARM Linux (aarch64-unknown-linux-gnu) on this x86-64 machine and
# installs it in one folder that runs under qemu-aarch64 here (tools/arm-check.sh), and should
# run as is on an aarch64 Linux machine with glibc >= 2.34 and GCC 12's libstdc++ (Debian 12,
# Ubuntu 22.04 or newer; not tried on one):
#
#   target/aarch64/bin/{spark,spark-convert,spark-gguf,llama-completion,llama-bench}
#                      (--server adds llama-server, without its web UI unless tools/upstream.sh
#                      built one, and llama-cli)
#   target/aarch64/lib/{libllama.so*,libggml*.so*,libllama-common.so*,libggml-spark.so}
#
# Every program finds its libraries through its run path ($ORIGIN/../lib): no LD_LIBRARY_PATH.
# Here: qemu-aarch64 target/aarch64/bin/spark run -m MODEL.gguf -p "ROMEO:" (never with -L or
# QEMU_LD_PREFIX: see tools/arm-env.sh); the plugin: GGML_BACKEND_PATH=$PWD/target/aarch64/lib/
# libggml-spark.so qemu-aarch64 target/aarch64/bin/llama-completion -m MODEL.gguf ...
#
# How (tools/arm-env.sh has the environment and why): Debian's Rust (rustc-web with
# libstd-rust-web-dev:arm64) and the GNU cross compilers, which tools/setup.sh installs; cargo
# builds the workspace for the target in target/aarch64/cargo, the patched llama.cpp included
# (cmake cross-compiles it, ggml for plain ARMv8.0 NEON: GGML_CPU_ARM_ARCH=armv8-a, which
# llama-cpp-sys-2 sets for aarch64 Linux without target-cpu=native; the Spark kernels choose
# NEON, dotprod, ... at run time); then, as tools/upstream.sh does natively, the tools' sources of
# the pinned sdist are added to that build's tree and the tool targets are built in the same
# cmake build directory, so llama.cpp is compiled once per target.
# About 13 min the first time on 2 cores (llama.cpp ~9 min of it), seconds when nothing changed;
# --server adds ~6 min the first time (llama-server's sources and libmtmd).
#
# Usage: bash tools/arm-build.sh [--quiet] [--server]
#   --quiet    no progress output (errors still go to stderr)
#   --server   also llama-server and llama-cli
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

quiet=0
server=0
for arg in "$@"; do
    case "$arg" in
        --quiet) quiet=1 ;;
        --server) server=1 ;;
        -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "arm-build: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
say() { if [ "$quiet" = 0 ]; then echo "arm-build: $*"; fi; }
die() { echo "arm-build: error: $*" >&2; exit 1; }

if [ "$quiet" = 1 ]; then
    bash tools/setup.sh >/dev/null
else
    bash tools/setup.sh
fi
# shellcheck source=tools/arm-env.sh
source tools/arm-env.sh
arm_require
python=$root/.venv/bin/python

TARGETS=(llama-completion llama-bench)
SERVER_TARGETS=(llama-server llama-cli)
[ "$server" = 1 ] && TARGETS+=("${SERVER_TARGETS[@]}")
BINS=(spark spark-convert spark-gguf)

out=$ARM_OUT
log=$out/log
mkdir -p "$log"

# 1. The workspace for aarch64. cargo's JSON messages name the llama.cpp build (the build
#    script's OUT_DIR), the plugin and the binaries.
say "cargo build --workspace --target $ARM_TARGET with $($RUSTC --version) (the first time also llama.cpp: ~13 min on 2 cores)"
messages=$log/cargo-messages.json
if [ "$quiet" = 1 ]; then
    arm_cargo build --workspace --message-format=json-render-diagnostics >"$messages" \
        2>"$log/cargo-stderr.txt" || { grep -v '^ *\(Compiling\|Blocking\|Building\)' \
        "$log/cargo-stderr.txt" | tail -n 60 >&2; die "cargo build for $ARM_TARGET failed (whole log: $log/cargo-stderr.txt)"; }
else
    arm_cargo build --workspace --message-format=json-render-diagnostics >"$messages" \
        || die "cargo build for $ARM_TARGET failed"
fi
read -r out_dir plugin profile_drift bin_list < <("$python" - "$messages" "${BINS[@]}" <<'EOF'
import json, sys
out_dir = plugin = None
drift = []
bins = {}
want = {"opt_level": "3", "debug_assertions": False, "overflow_checks": False}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and "patches/llama-cpp-sys-2" in m.get("package_id", ""):
        out_dir = m["out_dir"]
    if m.get("reason") != "compiler-artifact":
        continue
    t = m.get("target", {})
    if t.get("name") == "spark_backend":
        plugin = next((f for f in m.get("filenames", []) if f.endswith(".so")), plugin)
        profile = m.get("profile", {})
        drift += [f"{k}={json.dumps(profile.get(k))}" for k, v in want.items() if profile.get(k) != v]
    if "bin" in t.get("kind", []) and t.get("name") in sys.argv[2:] and m.get("executable"):
        bins[t["name"]] = m["executable"]
missing = [b for b in sys.argv[2:] if b not in bins]
print(out_dir or "-", plugin or "-", ",".join(drift) or "-",
      ",".join(bins[b] for b in sys.argv[2:]) if not missing else "missing:" + ",".join(missing))
EOF
)
[ "$out_dir" != - ] || die "cargo did not report the patched llama-cpp-sys-2 build (see $messages)"
[ "$plugin" != - ] || die "cargo did not report libspark_backend.so (see $messages)"
[ "$profile_drift" = - ] || die "spark-backend was compiled with $profile_drift, not at release \
speed (opt_level=3, no debug assertions or overflow checks): see [profile.dev.package.spark-backend] in Cargo.toml"
case "$bin_list" in missing:*) die "cargo did not report the binaries ${bin_list#missing:} (see $messages)" ;; esac
IFS=, read -r -a bin_paths <<<"$bin_list"
build=$out_dir/build
[ -f "$build/CMakeCache.txt" ] || die "no cmake build at $build"
grep -q '^CMAKE_SYSTEM_PROCESSOR:[A-Z]*=aarch64$' "$build/CMakeCache.txt" \
    || die "$build is not an aarch64 cmake build (CMAKE_SYSTEM_PROCESSOR in its CMakeCache.txt)"
arm_arch=$(sed -n 's/^GGML_CPU_ARM_ARCH:[A-Z]*=//p' "$build/CMakeCache.txt")
[ "$arm_arch" = armv8-a ] || die "ggml was configured with GGML_CPU_ARM_ARCH='$arm_arch', not armv8-a: \
it would not run on every aarch64 CPU (cortex-a57 under qemu)"
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
[ -f "$src/CMakeLists.txt" ] || die "cmake source directory '$src' not found"
# tools/arm-check.sh compares its test build's llama.cpp with this one (one llama.cpp per target)
echo "$out_dir" >"$out/llama-out-dir"

# 2. The tools' sources: the pinned sdist (tools/upstream.sh's SDIST_* lines), as upstream.sh
#    adds them to its build's tree (tools/llama-tree.sh checks it fits the patched tree).
quiet_flag=()
[ "$quiet" = 1 ] && quiet_flag=(--quiet)
tree=$(bash tools/llama-tree.sh "${quiet_flag[@]}" --sdist) || die "the pinned llama.cpp sdist is not available"
bash tools/llama-tree.sh "${quiet_flag[@]}" --add-tools "$tree" "$src" \
    || die "the pinned sdist does not fit the patched llama-cpp-sys-2 tree at $src"

# llama-server's web UI: the one tools/upstream.sh built from the same sdist (target/upstream/ui,
# architecture-independent files), else none.
ui_dist=$src/tools/ui/dist
if [ "$server" = 1 ]; then
    pin() { sed -n "s/^$1=//p" tools/upstream.sh | head -n 1; }
    sdist_file=$(pin SDIST_FILE)
    sdist_key="${sdist_file//\$SDIST_VERSION/$(pin SDIST_VERSION)} $(pin SDIST_SHA256)"
    ui_out=$root/target/upstream/ui
    if [ -f "$ui_out/dist/index.html" ] && [ "$(cat "$ui_out/built-from" 2>/dev/null)" = "$sdist_key" ]; then
        if ! diff -rq "$ui_out/dist" "$ui_dist" >/dev/null 2>&1; then
            rm -rf "$ui_dist"
            cp -r "$ui_out/dist" "$ui_dist"
        fi
        ui_note="embedded from $ui_out/dist"
    else
        rm -rf "$ui_dist"
        ui_note="none (tools/upstream.sh builds it into target/upstream/ui; then run this again)"
    fi
fi

# 3. The tool targets in the cargo build's cmake directory (its cache keeps the cross compilers
#    and CMAKE_SYSTEM_*); switched off again afterwards, as tools/upstream.sh does, because the
#    build script's `cmake --build --target install` would otherwise build every tool.
say "building ${TARGETS[*]} in $build"
# shellcheck source=tools/cmake-tools.sh
source tools/cmake-tools.sh
build_tool_targets "$src" "$build" "$log" "$quiet" "${TARGETS[@]}"

# 4. Install, each file written beside its destination and renamed over it.
mkdir -p "$out/bin" "$out/lib"
put() { # put SRC DST: copy preserving symlinks, replace atomically
    cp -P "$1" "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"
}
for i in "${!BINS[@]}"; do
    put "${bin_paths[$i]}" "$out/bin/${BINS[$i]}"
done
for t in "${TARGETS[@]}"; do
    put "$build/bin/$t" "$out/bin/$t"
done
if [ "$server" = 0 ]; then
    # a server from an earlier --server run would be linked against older libraries
    for t in "${SERVER_TARGETS[@]}"; do
        if [ -e "$out/bin/$t" ]; then
            rm -f "$out/bin/$t"
            echo "arm-build: removed $out/bin/$t of an earlier --server build (run with --server to rebuild it)" >&2
        fi
    done
fi
for lib in "$build"/bin/lib*.so*; do
    put "$lib" "$out/lib/$(basename "$lib")"
done
put "$plugin" "$out/lib/libggml-spark.so"

# 5. Check what was installed, under the most restrictive CPU model (plain ARMv8.0 NEON): every
#    program's llama.cpp libraries resolve to target/aarch64/lib through its run path (the
#    aarch64 loader lists them, as ldd would), and the plugin registers in the installed ggml.
export QEMU_CPU=cortex-a57
for b in "${BINS[@]}" "${TARGETS[@]}"; do
    listing=$(qemu-aarch64 /lib/ld-linux-aarch64.so.1 --list "$out/bin/$b" 2>&1) \
        || die "$out/bin/$b: the aarch64 loader cannot list its libraries: $listing"
    if grep -q 'not found' <<<"$listing"; then
        die "$out/bin/$b: $(grep 'not found' <<<"$listing" | head -n 1)"
    fi
    while read -r name _ path _; do
        case "$name" in
            libllama*|libggml*|libmtmd*)
                [ "$(realpath -m "$path")" = "$(realpath -m "$out/lib/$name")" ] \
                    || die "$out/bin/$b loads $name from $path, not from $out/lib" ;;
        esac
    done <<<"$listing"
done
devices=$(GGML_BACKEND_PATH="$out/lib/libggml-spark.so" qemu-aarch64 "$out/bin/llama-completion" \
    --list-devices 2>&1) || die "llama-completion --list-devices with the plugin failed: $devices"
if grep -q 'not registering' <<<"$devices"; then
    die "the plugin refused the installed ggml: $devices"
fi
say "installed in $out (aarch64; run under qemu-aarch64, never with -L / QEMU_LD_PREFIX):"
say "  bin: $(cd "$out/bin" && echo *)"
say "  plugin: $out/lib/libggml-spark.so (GGML_BACKEND_PATH=$out/lib/libggml-spark.so)"
if [ "$server" = 1 ]; then
    say "  llama-server's web UI: $ui_note"
fi
