#!/usr/bin/env bash
# KV cache types side by side (issue 56): Spark-Gemma2 and stock Gemma-2 (2B or 9B shapes, Q8_0
# weights, synthetic) through llama-bench, 2 threads, the same -ctk/-ctv for both, in one run:
#
#   Spark (plugin)    -ctk T -ctv T  (-fa 1: spark-gemma2 forces it off and runs its own attention)
#   stock gemma2      -fa 1 -ctk T -ctv T
#   stock gemma2      -fa 0 -ctk T -ctv T   (types with an unquantized V only: stock needs flash
#                                            attention for a quantized V cache)
#
# tests: pp512 and tg32 at each depth. Prints one markdown table: t/s, Spark / stock, the bytes
# a decode token reads (weights + KV cache, from the file's shapes: the ratio is the limit of a
# memory-bound decode) and the KV cache's MiB per 1K tokens. Records go to
# target/bench-kv/<size>.jsonl (llama-bench's own JSONL, one line per test).
#
# Usage: bash tools/bench-kv-cache.sh [--size 2b|9b] [--types f16,q8_0,q4_0]
#                                     [--depths 512,4096,8000] [-r N] [--render-only]
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh

size=2b types=f16,q8_0,q4_0 depths=512,4096,8000 reps=1 render_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --size) size=$2; shift 2 ;;
        --types) types=$2; shift 2 ;;
        --depths) depths=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --render-only) render_only=1; shift ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-kv-cache: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
bench=target/upstream/bin/llama-bench
plugin=target/upstream/lib/libggml-spark.so
bench_need "$bench" "$plugin"
bench_models target/bench-models "$size"
bench_python
out=target/bench-kv/$size.jsonl
mkdir -p "$(dirname "$out")"

# one llama-bench run: LABEL MODEL PLUGIN(0|1) ARGS...; appends its records tagged with LABEL
run() {
    local label=$1 model=$2 with_plugin=$3
    shift 3
    echo "bench-kv-cache: $label $*" >&2
    local env=(env -u GGML_BACKEND_PATH)
    [ "$with_plugin" = 1 ] && env=(env GGML_BACKEND_PATH="$plugin")
    "${env[@]}" "$bench" -m "$model" -t 2 -r "$reps" -o jsonl "$@" 2>/dev/null |
        "$python" -c 'import json, sys
for line in sys.stdin:
    if line.strip():
        r = json.loads(line); r["config"] = sys.argv[1]; print(json.dumps(r))' "$label" >> "$out"
}

if [ "$render_only" = 0 ]; then
    : > "$out"
    echo "bench-kv-cache: $(bench_cpu), records in $out" >&2
    for t in ${types//,/ }; do
        for what in "-p 512 -n 0" "-p 0 -n 32 -d $depths"; do
            # shellcheck disable=SC2086  # $what is word-split on purpose
            run "spark $t" "$spark" 1 -fa 1 -ctk "$t" -ctv "$t" $what
            # shellcheck disable=SC2086
            run "stock -fa 1 $t" "$stock" 0 -fa 1 -ctk "$t" -ctv "$t" $what
            case "$t" in
                f16|f32|bf16)
                    # shellcheck disable=SC2086
                    run "stock -fa 0 $t" "$stock" 0 -fa 0 -ctk "$t" -ctv "$t" $what ;;
            esac
        done
    done
fi
"$python" tools/kv-cache-table.py "$out" "$spark" "$stock"
