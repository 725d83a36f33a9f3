#!/usr/bin/env bash
# Parallel sequences: Spark vs stock Gemma-2 with upstream llama-batched-bench, in one run.
# Synthetic Gemma-2 2B shapes (random weights, Q8_0; speed does not depend on the values), the
# Spark model on the sparse kernels (the plugin), the stock gemma2 model on llama.cpp's own
# kernels; the two models alternate, once per repetition, and the table gives each model's
# decode (S_TG) and prompt (S_PP) throughput per number of parallel sequences with the ratio.
#
# Usage: bash tools/bench-batched.sh [-npl 1,2,4,8] [-npp 128] [-ntg 32] [-t 2] [-r 1]
#                                    [--upstream DIR] [--models DIR]
#   -npl/-npp/-ntg  as llama-batched-bench              default: 1,2,4,8 / 128 / 32
#   -t              threads                             default: 2
#   -r              repetitions (alternating models; the table gives means) default: 1
#   --upstream DIR  what tools/upstream.sh installed (bin/, lib/)   default: target/upstream
#   --models DIR    where the two models are made once (spark-convert --synthetic)
#                                                                default: target/bench-models
#   --out DIR       where the raw jsonl lines go                default: target/bench-batched
#   -- ARGS         passed on to llama-batched-bench (e.g. -- -ngl 99 on a GPU build)
# Raw jsonl lines go to OUT/batched-<model>-<rep>.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

npl=1,2,4,8 npp=128 ntg=32 threads=2 reps=1
upstream=target/upstream models=target/bench-models out=target/bench-batched
while [ $# -gt 0 ]; do
    case "$1" in
        -npl) npl=$2; shift 2 ;;
        -npp) npp=$2; shift 2 ;;
        -ntg) ntg=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --upstream) upstream=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-batched: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

bench=$upstream/bin/llama-batched-bench
plugin=$upstream/lib/libggml-spark.so
# shellcheck source=tools/bench-common.sh
source tools/bench-common.sh
bench_need "$bench" "$plugin"
bench_models "$models"
bench_python
mkdir -p "$out"

# Room for every sequence's prompt and generation (llama-batched-bench's n_kv_max).
max_npl=$(tr ',' '\n' <<<"$npl" | sort -n | tail -1)
ctx=$(( max_npl * (npp + ntg) + 256 ))
echo "bench-batched: $(bench_cpu), -t $threads, -c $ctx" >&2

for r in $(seq 1 "$reps"); do
    for m in spark stock; do
        model=$spark; [ "$m" = stock ] && model=$stock
        echo "bench-batched: repetition $r/$reps, $m" >&2
        # The plugin is loaded for both (the stock graph never calls it), as in bench-scaling.sh.
        GGML_BACKEND_PATH=$plugin "$bench" -m "$model" -c "$ctx" -b 2048 -ub 512 -t "$threads" \
            -npp "$npp" -ntg "$ntg" -npl "$npl" --output-format jsonl "$@" 2>"$out/batched-$m-$r.log" \
            | grep '^{' >"$out/batched-$m-$r.jsonl" \
            || { cat "$out/batched-$m-$r.log" >&2; exit 1; }
    done
done

"$python" - "$out" "$reps" <<'EOF'
import json, sys, statistics
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for m in ("spark", "stock"):
    for r in range(1, reps + 1):
        for line in open(f"{out}/batched-{m}-{r}.jsonl"):
            d = json.loads(line)
            rows.setdefault((d["pl"], m), []).append(d)
print("| parallel sequences | Spark S_TG t/s | stock S_TG t/s | S_TG ratio | Spark S_PP t/s | stock S_PP t/s | S_PP ratio |")
print("|---|---|---|---|---|---|---|")
for pl in sorted({k[0] for k in rows}):
    s = rows[(pl, "spark")]; g = rows[(pl, "stock")]
    stg = statistics.mean(d["speed_tg"] for d in s); gtg = statistics.mean(d["speed_tg"] for d in g)
    spp = statistics.mean(d["speed_pp"] for d in s); gpp = statistics.mean(d["speed_pp"] for d in g)
    print(f"| {pl} | {stg:.2f} | {gtg:.2f} | **{stg / gtg:.2f}x** | {spp:.2f} | {gpp:.2f} | {spp / gpp:.2f}x |")
EOF
