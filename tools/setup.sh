#!/usr/bin/env bash
# Installs what building and testing Spark needs on a fresh Debian machine and says what it
# installed:
#   - cmake (llama-cpp-sys-2 builds llama.cpp with it),
#   - libclang-dev (bindgen, through clang-sys, loads libclang.so / libclang-N.so and needs
#     clang's own headers such as stddef.h; Debian images often ship only libclang-cpp.so.N,
#     a different library that bindgen cannot use),
#   - chromium and chromium-driver (the browser test drives llama-server's web UI in a real
#     headless Chromium through WebDriver; without recommended packages),
#   - a Python venv at .venv with tests/requirements.txt (NumPy reference, gguf-py, pytest,
#     selenium, openai),
#   - the aarch64 cross build and its emulation (tools/arm-build.sh, tools/arm-check.sh): the
#     arm64 dpkg architecture, Debian's Rust toolchain rustc-web and cargo-web (an aarch64
#     standard library exists for it: libstd-rust-web-dev:arm64), the GNU cross compilers
#     gcc/g++-aarch64-linux-gnu with libc6-dev-arm64-cross, qemu-user (qemu-aarch64), and
#     libstdc++6:arm64 (with libc6:arm64: the loader and libraries the cross-built programs
#     load under qemu); without recommended packages (rust-web-llvm would add LLVM 22, unused);
#     on x86-64 hosts only.
# Not from here: Node.js >= 20.19 with npm, which tools/upstream.sh needs to build llama-server's
# web UI (Debian 12's nodejs is 18; upstream.sh says so and has --no-ui).
# Each dependency is detected the way its user finds it, not by a loose file-name match.
#
#
# Usage: bash tools/setup.sh [--build]
#   (no option)  everything above: what tests/run.sh needs.
#   --build      only what building the workspace needs (cmake, libclang-dev, git): what
#                README's demo (tools/demo.sh) uses; no browser, no aarch64 toolchain, no venv.
#
# A change to this script is verified from a new machine's state: tools/README.md, "Set-up".
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
case "${1:-}" in
    "") ;;
    --build) build_only=1 ;;
    *) echo "usage: bash tools/setup.sh [--build]" >&2; exit 2 ;;
esac

# The directories clang-sys searches for libclang (build/common.rs and build/dynamic.rs of
# clang-sys): $LIBCLANG_PATH, `llvm-config --libdir`, then the usual system directories.
libclang_dirs() {
    [ -n "${LIBCLANG_PATH:-}" ] && echo "$LIBCLANG_PATH"
    command -v llvm-config >/dev/null 2>&1 && llvm-config --libdir 2>/dev/null
    ls -d /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib 2>/dev/null
}

# True when a library bindgen accepts is there: libclang.so, libclang-N.so or their versioned
# names; never libclang-cpp (the C++ API, which has no clang_* C entry points bindgen calls).
have_libclang() {
    local dir f
    while read -r dir; do
        for f in "$dir"/libclang.so "$dir"/libclang.so.* "$dir"/libclang-[0-9]*.so \
            "$dir"/libclang-[0-9]*.so.*; do
            [ -e "$f" ] && return 0
        done
    done < <(libclang_dirs)
    return 1
}

# bindgen parses llama.h, which includes <stddef.h>/<stdbool.h>: clang's resource headers.
have_clang_headers() {
    ls /usr/lib/llvm-*/lib/clang/*/include/stddef.h >/dev/null 2>&1 \
        || ls /usr/lib/clang/*/include/stddef.h >/dev/null 2>&1
}

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
{ have_libclang && have_clang_headers; } || need_apt+=(libclang-dev)
command -v git >/dev/null 2>&1 || need_apt+=(git)
# The browser test's: Debian's Chromium and its WebDriver (same source package, same version).
need_browser=()
if [ "$build_only" = 0 ]; then
    command -v chromium >/dev/null 2>&1 || need_browser+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || need_browser+=(chromium-driver)
fi
# The aarch64 cross build's (tools/arm-env.sh says how each is used). Debian's rustc must be
# new enough for the workspace (Cargo.toml's rust-version) and must compile for aarch64 with its
# arm64 standard library: checked by compiling an empty crate, as the build will.
rust_version=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
debian_rustc_ok() {
    local v
    v=$(/usr/bin/rustc --version 2>/dev/null | awk '{print $2}') || return 1
    [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$rust_version" "${v%%-*}" | sort -V | head -n 1)" = "$rust_version" ]
}
aarch64_std_ok() {
    # (never `-o /dev/null`: rustc renames its output over the path, replacing the device)
    local dir ok=0
    dir=$(mktemp -d)
    printf '' | /usr/bin/rustc --target aarch64-unknown-linux-gnu --crate-type lib \
        --crate-name probe --emit metadata --out-dir "$dir" - >/dev/null 2>&1 || ok=1
    rm -rf "$dir"
    return "$ok"
}
need_arm=()
# Only on x86-64 hosts: on an ARM machine the ordinary build is the ARM build (README, "ARM CPUs").
cross_host=0
[ "$(uname -m)" = x86_64 ] && [ "$build_only" = 0 ] && cross_host=1
if [ "$cross_host" = 1 ]; then
    debian_rustc_ok || need_arm+=(rustc-web)
    [ -x /usr/bin/cargo ] || need_arm+=(cargo-web)
    { debian_rustc_ok && aarch64_std_ok; } || need_arm+=(libstd-rust-web-dev:arm64)
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need_arm+=(gcc-aarch64-linux-gnu)
    command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need_arm+=(g++-aarch64-linux-gnu)
    [ -f /usr/aarch64-linux-gnu/include/stdio.h ] || need_arm+=(libc6-dev-arm64-cross)
    command -v qemu-aarch64 >/dev/null 2>&1 || need_arm+=(qemu-user)
    { [ -e /lib/ld-linux-aarch64.so.1 ] && [ -e /usr/lib/aarch64-linux-gnu/libstdc++.so.6 ]; } \
        || need_arm+=(libstdc++6:arm64)
fi
installing=("${need_apt[@]}" "${need_browser[@]}" "${need_arm[@]}")
if [ ${#installing[@]} -gt 0 ]; then
    echo "setup: installing ${installing[*]} with apt-get"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    if [ ${#need_arm[@]} -gt 0 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
        echo "setup: adding the arm64 architecture to dpkg (for libstd-rust-web-dev:arm64, libstdc++6:arm64)"
        $SUDO dpkg --add-architecture arm64
    fi
    $SUDO apt-get update -qq
    if [ ${#need_apt[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
    fi
    if [ ${#need_browser[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            "${need_browser[@]}" >/dev/null
    fi
    if [ ${#need_arm[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            "${need_arm[@]}" >/dev/null
    fi
    # Check the result the same way, so a package that no longer provides what we need fails
    # here with a clear line instead of minutes later inside bindgen or cmake.
    command -v cmake >/dev/null 2>&1 || { echo "setup: cmake still missing" >&2; exit 1; }
    have_libclang || { echo "setup: libclang.so still missing after apt-get" >&2; exit 1; }
    have_clang_headers || { echo "setup: clang's stddef.h still missing" >&2; exit 1; }
    if [ "$build_only" = 0 ]; then
        command -v chromium >/dev/null 2>&1 || { echo "setup: chromium still missing" >&2; exit 1; }
        command -v chromedriver >/dev/null 2>&1 || { echo "setup: chromedriver still missing" >&2; exit 1; }
    fi
    if [ "$cross_host" = 1 ]; then
        debian_rustc_ok || { echo "setup: /usr/bin/rustc (rustc-web) missing or older than $rust_version" >&2; exit 1; }
        [ -x /usr/bin/cargo ] || { echo "setup: /usr/bin/cargo (cargo-web) still missing" >&2; exit 1; }
        aarch64_std_ok || { echo "setup: /usr/bin/rustc cannot compile for aarch64-unknown-linux-gnu (libstd-rust-web-dev:arm64 of its version?)" >&2; exit 1; }
        for c in aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ qemu-aarch64; do
            command -v "$c" >/dev/null 2>&1 || { echo "setup: $c still missing" >&2; exit 1; }
        done
        [ -e /usr/lib/aarch64-linux-gnu/libstdc++.so.6 ] || { echo "setup: libstdc++6:arm64 still missing" >&2; exit 1; }
    fi
    echo "setup: installed ${installing[*]}"
elif [ "$build_only" = 1 ]; then
    echo "setup: cmake, libclang and git present, nothing to install with apt-get"
elif [ "$cross_host" = 1 ]; then
    echo "setup: cmake, libclang, git, chromium, chromedriver and the aarch64 cross toolchain with qemu present, nothing to install with apt-get"
else
    echo "setup: cmake, libclang, git, chromium and chromedriver present, nothing to install with apt-get"
fi

if [ "$build_only" = 1 ]; then
    echo "setup: done (--build: what building needs)"
    exit 0
fi
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r tests/requirements.txt
echo "setup: done"
