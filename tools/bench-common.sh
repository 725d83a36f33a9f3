# Sourced by the tools/bench-*.sh scripts (run from the repository root): what they share.
#
#   bench_need FILE...     exits with a hint when one of what tools/upstream.sh installs is missing
#   bench_models DIR [SIZE] sets $spark and $stock: the synthetic Gemma-2 SIZE (2b, default, or
#                          9b) Q8_0 models (Spark and stock gemma2; random weights, speed does not
#                          depend on them), made once in DIR with spark-convert ($SPARK_CONVERT,
#                          else target/*/; it sets $convert to that converter)
#   bench_paired_model DIR SIZE  prints the path of the same Spark model with K2 and V side by
#                          side (--pair-k2v), made once in DIR
#   bench_python           sets $python: the project's .venv interpreter, else python3
#   bench_cpu              prints the CPU model and count

bench_need() {
    local f
    for f in "$@"; do
        [ -e "$f" ] || { echo "$(basename "$0" .sh): $f missing: run bash tools/upstream.sh" >&2; exit 1; }
    done
}

bench_models() {
    local c
    convert=
    for c in ${SPARK_CONVERT:-} target/debug/spark-convert target/release/spark-convert; do
        if [ -x "$c" ]; then convert=$c; break; fi
    done
    [ -n "$convert" ] || { echo "$(basename "$0" .sh): spark-convert not found: cargo build" >&2; exit 1; }
    local size=${2:-2b}
    mkdir -p "$1"
    spark=$1/spark-gemma2-$size-q8_0.gguf
    stock=$1/gemma2-$size-q8_0.gguf
    local made=0
    [ -f "$spark" ] || { "$convert" --synthetic "spark-gemma2-$size" "$spark" --outtype q8_0 --quiet; made=1; }
    [ -f "$stock" ] || { "$convert" --synthetic "gemma2-$size" "$stock" --outtype q8_0 --quiet; made=1; }
    [ "$made" = 0 ] || bench_models_disk "$1"
}

# bench_models_disk DIR: one line on stderr with the disk the models in DIR take (the 9B set is
# ~30 GB; the disk is shared with CI, whose run once failed on a full one)
bench_models_disk() {
    echo "$(basename "$0" .sh): the models in $1 take $(du -sh "$1" | cut -f1) of disk;" \
         "they are made again on demand, so \`rm -r $1\` frees it when done" >&2
}

# bench_paired_model DIR SIZE: prints the path of the Spark model of bench_models with its K2 and V
# rows side by side (spark-convert --pair-k2v), made once in DIR (after bench_models)
bench_paired_model() {
    local out=$1/spark-gemma2-$2-q8_0-paired.gguf
    if [ ! -f "$out" ]; then
        "$convert" --synthetic "spark-gemma2-$2" "$out" --outtype q8_0 --pair-k2v --quiet >&2
        bench_models_disk "$1"
    fi
    echo "$out"
}

bench_python() {
    python=.venv/bin/python
    [ -x "$python" ] || python=python3
}

# "<CPU model> (<machine>), <n> CPUs" on x86 and ARM Linux (lscpu, else /proc/cpuinfo, whose
# ARM form has no model name) and macOS (sysctl).
bench_cpu() {
    local name=""
    if command -v lscpu >/dev/null 2>&1; then
        name=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
    fi
    if [ -z "$name" ] && [ -r /proc/cpuinfo ]; then
        name=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)
    fi
    if [ -z "$name" ] && command -v sysctl >/dev/null 2>&1; then
        name=$(sysctl -n machdep.cpu.brand_string 2>/dev/null || true)
    fi
    echo "${name:-unknown CPU} ($(uname -m)), $(getconf _NPROCESSORS_ONLN) CPUs"
}
