#!/usr/bin/env bash
# Installs llama-cpp-python (`from llama_cpp import Llama`) into the project's .venv, bound to
# the project's own llama.cpp build: the libraries tools/upstream.sh installs in
# target/upstream/lib, where the Spark plugin (libggml-spark.so) sits beside the ggml it was
# built for. Nothing of llama.cpp is compiled a second time: the pinned sdist is installed with
# its own llama.cpp build switched off (-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF), and its library
# directory (site-packages/llama_cpp/lib) is made a link to target/upstream/lib.
#
# llama-cpp-python's bindings are hand-written ctypes declarations of llama.h (and of ggml.h's
# enums, mtmd.h, mtmd-helper.h): a struct that differs from the library's corrupts memory
# without an error. So the version is pinned, and the install refuses when the sdist's vendored
# headers differ from the ones the libraries were built with (target/upstream/include): llama.h
# in anything but LLAMA_SESSION_VERSION and LLAMA_STATE_SEQ_VERSION (constants the bindings
# only restate), ggml.h in anything, mtmd.h and mtmd-helper.h in their C declarations (as the
# C preprocessor sees them: mtmd.h's C++-only part is not reachable through ctypes).
#
# Then (README, "Python"):
#   GGML_BACKEND_PATH=$PWD/target/upstream/lib/libggml-spark.so .venv/bin/python -c \
#       'from llama_cpp import Llama; print(Llama("model.gguf")("ROMEO:", max_tokens=32))'
#
# Usage: bash tools/python.sh [--release] [--quiet] [--no-ui] [--no-build]
#   runs `bash tools/upstream.sh` with these options first (idempotent; builds what is missing),
#   then installs llama-cpp-python when it is not installed and bound as above already.
#   --no-build    take target/upstream as it is (tests/run.sh: upstream.sh has just run)
#   --check-only  only compare the headers (exit 1 on a difference; implies --no-build);
#                 SPARK_UPSTREAM_DIR=DIR compares with DIR/include instead of target/upstream's
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

quiet=0
build=1
check_only=0
upstream_args=()
for arg in "$@"; do
    case "$arg" in
        --release|--no-ui) upstream_args+=("$arg") ;;
        --quiet) quiet=1; upstream_args+=("$arg") ;;
        --no-build) build=0 ;;
        --check-only) check_only=1; build=0 ;;
        -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "python: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
say() { if [ "$quiet" = 0 ]; then echo "python: $*"; fi; }
die() { echo "python: error: $*" >&2; exit 1; }

# The pinned package (PyPI sdist) and its dependencies, pinned too.
PKG_NAME=llama-cpp-python
PKG_VERSION=0.3.36
PKG_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
PKG_FILE=llama_cpp_python-$PKG_VERSION.tar.gz
PKG_DEPS=(diskcache==5.6.3 jinja2==3.1.6 markupsafe==3.0.4 typing-extensions==4.16.0)
BUILD_DEPS=(scikit-build-core==1.1.2 pathspec==1.1.1)
# The only lines in which its vendored llama.h may differ from ours.
LLAMA_H_ALLOWED='^#define (LLAMA_SESSION_VERSION|LLAMA_STATE_SEQ_VERSION) '

# 1. The project's llama.cpp libraries and headers (and setup.sh's .venv).
if [ "$build" = 1 ]; then
    bash tools/upstream.sh "${upstream_args[@]}"
fi
up=$root/target/upstream
if [ "$check_only" = 1 ] && [ -n "${SPARK_UPSTREAM_DIR:-}" ]; then
    up=$SPARK_UPSTREAM_DIR
fi
lib=$up/lib
inc=$up/include
python=$root/.venv/bin/python
for f in "$inc/llama.h" "$inc/ggml.h" "$inc/mtmd.h" "$inc/mtmd-helper.h"; do
    [ -e "$f" ] || die "$f is missing: run bash tools/upstream.sh"
done

# 2. The sdist, checked.
dl=$root/target/python
mkdir -p "$dl"
tarball=$dl/$PKG_FILE
sha_ok() { [ -f "$tarball" ] && echo "$PKG_SHA256  $tarball" | sha256sum --check --status; }
if ! sha_ok; then
    say "downloading $PKG_NAME==$PKG_VERSION (PyPI sdist, 77 MB)"
    rm -f "$tarball"
    # pip prepares an sdist's metadata even for a download: with the pinned build backend
    "$python" -m pip install --quiet --disable-pip-version-check "${BUILD_DEPS[@]}" \
        || die "pip install ${BUILD_DEPS[*]} failed"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --no-build-isolation \
        --no-binary "$PKG_NAME" "$PKG_NAME==$PKG_VERSION" -d "$dl" \
        || die "pip download $PKG_NAME==$PKG_VERSION failed"
    sha_ok || die "$tarball: sha256 is not $PKG_SHA256"
fi

# 3. Its vendored headers against ours, every time (our build may have moved on).
hdr=$dl/headers-$PKG_VERSION
if [ ! -f "$hdr/theirs/mtmd-helper.h" ]; then  # unpacked once (the last file copied)
    rm -rf "$hdr"
    mkdir -p "$hdr/theirs"
    vendor=llama_cpp_python-$PKG_VERSION/vendor/llama.cpp
    tar -xzf "$tarball" -C "$hdr" "$vendor/include" "$vendor/ggml/include" \
        "$vendor/tools/mtmd/mtmd.h" "$vendor/tools/mtmd/mtmd-helper.h"
    cp "$hdr/$vendor"/include/*.h "$hdr/$vendor"/ggml/include/*.h "$hdr/$vendor"/tools/mtmd/mtmd.h \
        "$hdr/theirs/"
    cp "$hdr/$vendor/tools/mtmd/mtmd-helper.h" "$hdr/theirs/"
fi
refuse() {
    die "llama-cpp-python $PKG_VERSION's $1 differs from the one the project's llama.cpp was \
built with ($inc/$1): its ctypes bindings would not match the library. Differences (< theirs, \
> ours):
$2
Pin a llama-cpp-python whose vendored llama.cpp matches (PKG_VERSION in $0)."
}
d=$(diff <(grep -Ev "$LLAMA_H_ALLOWED" "$hdr/theirs/llama.h") <(grep -Ev "$LLAMA_H_ALLOWED" "$inc/llama.h")) \
    || refuse llama.h "$d"
d=$(diff "$hdr/theirs/ggml.h" "$inc/ggml.h") || refuse ggml.h "$d"
# The C view of a header: the lines the C preprocessor keeps of that file itself (definitions
# kept: -dD), each tree's headers including their own neighbours.
c_view() {
    cc -E -dD -x c -I "$1" "$1/$2" | awk -v want="$2" '
        /^# [0-9]+ "/ { f = $3; gsub(/"/, "", f); sub(/.*\//, "", f); here = (f == want); next }
        here && NF { print }'
}
for h in mtmd.h mtmd-helper.h; do
    d=$(diff <(c_view "$hdr/theirs" "$h") <(c_view "$inc" "$h")) || refuse "$h" "$d"
done
say "headers: llama.h, ggml.h, mtmd.h, mtmd-helper.h of $PKG_FILE match $inc"
[ "$check_only" = 0 ] || exit 0
for f in "$lib/libllama.so" "$lib/libmtmd.so" "$lib/libggml-spark.so"; do
    [ -e "$f" ] || die "$f is missing: run bash tools/upstream.sh"
done

# 4. Install, unless this version is installed and bound already.
installed() {
    "$python" - "$PKG_VERSION" "$lib" <<'EOF'
import importlib.metadata as md, os, sys
try:
    version = md.version("llama_cpp_python")
except md.PackageNotFoundError:
    sys.exit(1)
pkg = md.distribution("llama_cpp_python").locate_file("llama_cpp")
link = os.path.join(pkg, "lib")
sys.exit(0 if version == sys.argv[1] and os.path.islink(link)
         and os.path.realpath(link) == os.path.realpath(sys.argv[2]) else 1)
EOF
}
if ! installed; then
    say "installing $PKG_NAME==$PKG_VERSION into .venv (its llama.cpp build switched off)"
    log=$dl/pip-install.log
    {
        "$python" -m pip install --disable-pip-version-check "${BUILD_DEPS[@]}" "${PKG_DEPS[@]}" \
        && CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$python" -m pip install \
            --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall \
            "$tarball"
    } >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "pip install failed (log: $log)"; }
    pkg=$("$python" -c 'import importlib.metadata as md; print(md.distribution("llama_cpp_python").locate_file("llama_cpp"))')
    [ -f "$pkg/llama_cpp.py" ] || die "the installed package has no $pkg/llama_cpp.py"
    # Its library directory: the project's build (the package installed none of its own).
    if [ -e "$pkg/lib" ] && [ ! -L "$pkg/lib" ]; then
        leftovers=$(find "$pkg/lib" -mindepth 1 -print -quit)
        [ -z "$leftovers" ] || die "$pkg/lib holds libraries of the package's own ($leftovers)"
        rmdir "$pkg/lib"
    fi
    ln -sfn "$lib" "$pkg/lib"
    installed || die "llama-cpp-python is not installed and bound after pip install (log: $log)"
fi

# 5. Check: it loads the project's libllama (the library, through the link, not another copy).
loaded=$(env -u LLAMA_CPP_LIB_PATH "$python" -c '
import os, llama_cpp
print(llama_cpp.__version__, os.path.realpath(llama_cpp.llama_cpp._lib._name))') \
    || die "import llama_cpp failed"
[ "$loaded" = "$PKG_VERSION $(realpath "$lib/libllama.so")" ] \
    || die "llama_cpp loads '$loaded', not $PKG_VERSION with $(realpath "$lib/libllama.so")"
say "llama-cpp-python $PKG_VERSION in .venv, bound to $lib"
say "  run Spark models with GGML_BACKEND_PATH=$lib/libggml-spark.so (README, \"Python\")"
