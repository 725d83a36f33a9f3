#!/usr/bin/env bash
# The patched llama.cpp tree the project builds, as one command makes it:
#
#   1. the pristine llama.cpp of the pinned llama-cpp-sys-2 crate (from cargo's cache; the
#      ordinary cargo client fetches it when missing),
#   2. the sources the project adds, copied in from patches/llama.cpp/files/ (same relative
#      paths: files/src/models/spark-gemma2.cpp -> src/models/spark-gemma2.cpp),
#   3. the series of edits to upstream files, patches/llama.cpp/*.patch, applied in order with
#      `git apply` (as patches/spark-llama-prep does for the cargo build).
#
# Usage:
#   bash tools/llama-tree.sh [--tools] [--git] DIR
#       writes the tree into DIR/llama.cpp (DIR must not exist).
#       --tools  adds upstream's tools/, examples/ and scripts/ from the pinned PyPI sdist that
#                tools/upstream.sh uses (the crate leaves them out), after checking that the
#                sdist's headers are the tree's: a tree that builds llama-cli, llama-server, ...
#                with plain cmake (patches/README.md, "Building without cargo")
#       --git    makes DIR/llama.cpp a git repository for editing: commit `base` (pristine,
#                tagged base), commit `files` (step 2, tagged spark-files), then one commit per
#                patch (`git am`); edit, then --export
#   bash tools/llama-tree.sh --export DIR
#       the reverse of --git after editing DIR/llama.cpp: its copies of the project's files go
#       back to patches/llama.cpp/files/, and `git format-patch --no-numbered spark-files..HEAD`
#       replaces the patches whose content changed (a new From line or date alone does not
#       rewrite a patch); patches no longer in the range are removed
#   bash tools/llama-tree.sh --sdist
#       prints the llama.cpp folder of tools/upstream.sh's pinned PyPI sdist (its SDIST_* lines),
#       downloaded (sha256 checked) and unpacked once under target/upstream/dl
#   bash tools/llama-tree.sh --add-tools SDIST_LLAMA TREE
#       the step --tools adds to a tree, for a tree made otherwise (tools/upstream.sh uses it on
#       the cargo build's tree): the sdist's headers checked against TREE's, then its tools/,
#       examples/ and scripts/ copied in without overwriting anything
#   bash tools/llama-tree.sh --tag
#       prints the series tag, spark-<12 hex>, exactly as spark-llama-prep computes it: the git
#       blob hash of "llama-cpp-sys-2 <version>\n", then per patch in name order "<name>\n<bytes>",
#       then per file of patches/llama.cpp/files in path order "files/<path>\n<bytes>". The plugin
#       and the tools built from the tree carry it (GGML_BUILD_COMMIT_OVERRIDE, patch 0005).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
series=$root/patches/llama.cpp
files=$series/files

quiet=0
die() { echo "llama-tree: error: $*" >&2; exit 1; }
say() { if [ "$quiet" = 0 ]; then echo "llama-tree: $*" >&2; fi; }

version=$(sed -n 's/^const SYS_VERSION: &str = "\(.*\)";/\1/p' patches/spark-llama-prep/build.rs)
[ -n "$version" ] || die "no SYS_VERSION in patches/spark-llama-prep/build.rs"
mapfile -t patches < <(find "$series" -maxdepth 1 -name '*.patch' | LC_ALL=C sort)
[ "${#patches[@]}" -gt 0 ] || die "no patches in $series"
mapfile -t new_files < <(cd "$files" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)

series_tag() {
    local p f
    {
        printf 'llama-cpp-sys-2 %s\n' "$version"
        for p in "${patches[@]}"; do printf '%s\n' "$(basename "$p")"; cat "$p"; done
        for f in "${new_files[@]}"; do printf 'files/%s\n' "$f"; cat "$files/$f"; done
    } | git hash-object --no-filters --stdin | cut -c1-12 | sed 's/^/spark-/'
}

pristine_tree() {
    local d
    for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"llama-cpp-sys-2-$version"; do
        if [ -f "$d/llama.cpp/CMakeLists.txt" ]; then echo "$d/llama.cpp"; return; fi
    done
    # Not in cargo's cache yet: let the ordinary cargo client fetch it.
    local probe
    probe=$(mktemp -d)
    mkdir -p "$probe/src"
    : >"$probe/src/lib.rs"
    printf '[package]\nname = "spark-llama-probe"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nllama-cpp-sys-2 = { version = "=%s", default-features = false }\n[workspace]\n' \
        "$version" >"$probe/Cargo.toml"
    cargo metadata --format-version 1 --manifest-path "$probe/Cargo.toml" | python3 -c '
import json, os, sys
m = next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "llama-cpp-sys-2")
print(os.path.join(os.path.dirname(m), "llama.cpp"))'
    rm -rf "$probe"
}

# The tools' sources: tools/upstream.sh's pinned sdist (its constants are read from that script,
# so there is one pin), from its download cache or downloaded the same way.
sdist_llama() {
    local name ver sha dl tarball top
    pin() { sed -n "s/^$1=//p" tools/upstream.sh | head -1; }
    name=$(pin SDIST_NAME) ver=$(pin SDIST_VERSION) sha=$(pin SDIST_SHA256)
    [ -n "$name" ] && [ -n "$ver" ] && [ -n "$sha" ] || die "could not read the sdist pin from tools/upstream.sh"
    dl=$root/target/upstream/dl
    tarball=$dl/${name//-/_}-$ver.tar.gz
    mkdir -p "$dl"
    if ! { [ -f "$tarball" ] && echo "$sha  $tarball" | sha256sum --check --status; }; then
        say "downloading $name==$ver (PyPI sdist, 37 MB)"
        rm -f "$tarball"
        # --no-binary for this package only: with :all: pip would build cmake from source
        python3 -m pip download --quiet --no-deps --no-binary "$name" "$name==$ver" -d "$dl" \
            || die "pip download failed"
        echo "$sha  $tarball" | sha256sum --check --status || die "$tarball: wrong sha256"
    fi
    top=${name//-/_}-$ver/llama.cpp
    if [ ! -f "$dl/$top/tools/server/server.cpp" ]; then
        say "unpacking $(basename "$tarball")"
        rm -rf "$dl/${top%/llama.cpp}"
        tar -xzf "$tarball" -C "$dl" "$top" || die "cannot unpack $tarball"
    fi
    echo "$dl/$top"
}

# add_tools SDIST TREE: checks that what upstream's tools compile against (include/, common/,
# ggml/include/, vendor/) is the same in the sdist's llama.cpp and in TREE, apart from the files
# the series changes or adds there (ggml-cuda.h, ggml-rpc.h, ...), then copies the sdist's
# tools/, examples/ (llama-gguf-hash lives there) and scripts/ (the server's UI step runs
# scripts/ui-assets.cmake) into TREE without overwriting a file that is there, so the series'
# files and cmake's timestamps stay as they are.
add_tools() {
    local sd=$1 t=$2 changed excludes d f
    changed=$( { sed -n 's|^diff --git a/\([^ ]*\) b/.*|\1|p' "${patches[@]}"
                 printf '%s\n' "${new_files[@]}"; } | sort -u)
    for d in include common ggml/include vendor; do
        excludes=()
        for f in $changed; do
            case "$f" in "$d"/*) excludes+=(-x "$(basename "$f")") ;; esac
        done
        diff -rq "${excludes[@]}" "$sd/$d" "$t/$d" >/dev/null \
            || die "the sdist's $d/ differs from the patched tree at $t"
    done
    for d in tools examples scripts; do
        mkdir -p "$t/$d"
        cp -rn "$sd/$d/." "$t/$d/"
    done
}

make_tree() {
    local dir=$1 tools=$2 git=$3 src p f
    [ ! -e "$dir" ] || die "$dir exists (give a new directory)"
    src=$(pristine_tree)
    [ -f "$src/CMakeLists.txt" ] || die "pristine llama.cpp not found at $src"
    mkdir -p "$dir"
    cp -r "$src" "$dir/llama.cpp"
    local t=$dir/llama.cpp
    # GIT_CEILING_DIRECTORIES: never discover the project's own checkout around the tree
    export GIT_CEILING_DIRECTORIES=$dir
    if [ "$git" = 1 ]; then
        git -C "$t" init -q
        git -C "$t" add -A -f .
        git -C "$t" -c user.name=spark -c user.email=spark@localhost commit -q -m base
        git -C "$t" tag base
    fi
    for f in "${new_files[@]}"; do
        [ ! -e "$t/$f" ] || die "files/$f is also an upstream file: change it with a patch"
        mkdir -p "$(dirname "$t/$f")"
        cp "$files/$f" "$t/$f"
    done
    if [ "$git" = 1 ]; then
        git -C "$t" add -A -f .
        git -C "$t" -c user.name=spark -c user.email=spark@localhost commit -q \
            -m "files: the sources the project adds (patches/llama.cpp/files)"
        git -C "$t" tag spark-files
        git -C "$t" -c user.name=spark -c user.email=spark@localhost am -q "${patches[@]}" \
            || die "git am failed (the series does not apply to the pristine tree)"
    else
        for p in "${patches[@]}"; do
            git -C "$t" apply --whitespace=nowarn "$p" || die "$(basename "$p") does not apply"
        done
    fi
    if [ "$tools" = 1 ]; then
        local sd
        sd=$(sdist_llama) || exit 1
        add_tools "$sd" "$t"
    fi
    say "patched llama.cpp ($(series_tag)) in $t"
}

export_tree() {
    local t=$1/llama.cpp out f p name changed=0
    [ -d "$t/.git" ] || die "$t is not a tree made with --git"
    export GIT_CEILING_DIRECTORIES=$1
    git -C "$t" rev-parse -q --verify spark-files >/dev/null || die "$t has no tag spark-files"
    # the project's files: those the files commit added, as the tree has them now
    while read -r f; do
        [ -f "$t/$f" ] || die "$f was deleted in $t (remove it from patches/llama.cpp/files by hand)"
        if ! cmp -s "$t/$f" "$files/$f"; then
            mkdir -p "$(dirname "$files/$f")"
            cp "$t/$f" "$files/$f"
            say "files/$f updated"
            changed=1
        fi
    done < <(git -C "$t" diff --name-only base spark-files)
    out=$(mktemp -d)
    # (--no-numbered: "[PATCH]" subjects, which adding a patch to the series does not change)
    git -C "$t" format-patch -q --no-numbered -o "$out" spark-files..HEAD
    # a patch's identity is its content: the From line and Date change on every export
    body() { sed '1d; /^Date: /d' "$1"; }
    for p in "$out"/*.patch; do
        name=$(basename "$p")
        if [ ! -f "$series/$name" ] || ! cmp -s <(body "$p") <(body "$series/$name"); then
            cp "$p" "$series/$name"
            say "$name written"
            changed=1
        fi
    done
    for p in "${patches[@]}"; do
        if [ ! -f "$out/$(basename "$p")" ]; then
            rm "$p"
            say "$(basename "$p") removed (not in spark-files..HEAD)"
            changed=1
        fi
    done
    rm -rf "$out"
    [ "$changed" = 1 ] || say "nothing changed"
}

tools=0 git=0
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) series_tag; exit 0 ;;
        --export) [ $# -eq 2 ] || die "--export takes the directory made with --git"; export_tree "$2"; exit 0 ;;
        --quiet) quiet=1 ;;
        --sdist) sd=$(sdist_llama) || exit 1; echo "$sd"; exit 0 ;;
        --tools) tools=1 ;;
        --add-tools) [ $# -eq 3 ] || die "--add-tools takes the sdist's llama.cpp and a tree"
                     add_tools "$2" "$3"; exit 0 ;;
        --git) git=1 ;;
        -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ $# -eq 1 ] || die "one directory, after the options"; make_tree "$1" "$tools" "$git"; exit 0 ;;
    esac
    shift
done
die "give a directory, --tag or --export DIR (see --help)"
