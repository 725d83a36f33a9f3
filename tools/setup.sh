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
#     selenium, openai).
# Not from here: Node.js >= 20.19 with npm, which tools/upstream.sh needs to build llama-server's
# web UI (Debian 12's nodejs is 18; upstream.sh says so and has --no-ui).
# Each dependency is detected the way its user finds it, not by a loose file-name match.
#
# A change to this script is verified from a new machine's state: tools/README.md, "Set-up".
set -euo pipefail
cd "$(dirname "$0")/.."

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
command -v chromium >/dev/null 2>&1 || need_browser+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_browser+=(chromium-driver)
installing=("${need_apt[@]}" "${need_browser[@]}")
if [ ${#installing[@]} -gt 0 ]; then
    echo "setup: installing ${installing[*]} with apt-get"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    if [ ${#need_apt[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
    fi
    if [ ${#need_browser[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            "${need_browser[@]}" >/dev/null
    fi
    # Check the result the same way, so a package that no longer provides what we need fails
    # here with a clear line instead of minutes later inside bindgen or cmake.
    command -v cmake >/dev/null 2>&1 || { echo "setup: cmake still missing" >&2; exit 1; }
    have_libclang || { echo "setup: libclang.so still missing after apt-get" >&2; exit 1; }
    have_clang_headers || { echo "setup: clang's stddef.h still missing" >&2; exit 1; }
    command -v chromium >/dev/null 2>&1 || { echo "setup: chromium still missing" >&2; exit 1; }
    command -v chromedriver >/dev/null 2>&1 || { echo "setup: chromedriver still missing" >&2; exit 1; }
    echo "setup: installed ${installing[*]}"
else
    echo "setup: cmake, libclang, git, chromium and chromedriver present, nothing to install with apt-get"
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r tests/requirements.txt
echo "setup: done"
