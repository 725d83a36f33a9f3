#!/usr/bin/env bash
# Spark vs stock Gemma-2 with upstream llama-bench, side by side in one run: synthetic Gemma-2 2B
# shapes (random weights, Q8_0; speed does not depend on the values), the Spark model on the
# sparse kernels (the plugin), the stock gemma2 model on llama.cpp's own kernels.
#
# Usage: bash tools/bench-scaling.sh [-t 1,2] [-r 3] [-d 512] [-p 512] [-n 128] [-ub 64]
#                                    [--upstream DIR] [--models DIR] [-o md|json]
#   -t       thread counts (llama-bench list syntax)          default: 1,2
#   -p/-n/-d/-ub/-r  as llama-bench                          default: 512 / 128 / 0,512 / 64 / 3
#   --upstream DIR  what tools/upstream.sh installed (bin/, lib/)   default: target/upstream
#   --models DIR    where the two models are made once (spark-convert --synthetic)
#                                                                default: target/bench-models
#   -o md|json      llama-bench's output format                  default: md
#   -- ARGS         passed on to llama-bench (e.g. -- --no-warmup)
# Needs spark-convert (target/debug or target/release). Prints the CPU model first.
set -euo pipefail
cd "$(dirname "$0")/.."

threads=1,2 reps=3 depth=0,512 prompt=512 gen=128 ubatch=64 fmt=md
upstream=target/upstream models=target/bench-models
while [ $# -gt 0 ]; do
    case "$1" in
        -t) threads=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        -d) depth=$2; shift 2 ;;
        -p) prompt=$2; shift 2 ;;
        -n) gen=$2; shift 2 ;;
        -ub) ubatch=$2; shift 2 ;;
        -o) fmt=$2; shift 2 ;;
        --upstream) upstream=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-scaling: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

bench=$upstream/bin/llama-bench
plugin=$upstream/lib/libggml-spark.so
# shellcheck source=tools/bench-common.sh
source tools/bench-common.sh
bench_need "$bench" "$plugin"
bench_models "$models"

echo "bench-scaling: $(bench_cpu)" >&2
# Both models in one llama-bench run (the plugin registers for the whole process; the stock
# model's graph never calls it), so the two are measured side by side, interleaved by test.
GGML_BACKEND_PATH=$plugin "$bench" -m "$spark" -m "$stock" -t "$threads" -p "$prompt" \
    -n "$gen" -d "$depth" -ub "$ubatch" -r "$reps" -o "$fmt" "$@"
