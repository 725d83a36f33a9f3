#!/usr/bin/env bash
# Spark and stock Gemma-2 under memory budgets, side by side in one run: decode (and prefill) with
# upstream llama-bench while tools/memory-budget.py holds the rest of the machine's memory, from
# "the model fits" down to "Spark's always-read set + 10 %", repack on and off (docs/PERF.md,
# "Models larger than memory").
#
# Usage: bash tools/bench-memory.sh [--size 2b|9b] [--leave GB,GB,...] [--repack 0,1] [-n 16]
#                                   [-p 0] [-r 1] [--overhead GB] [--paging auto,never]
#                                   [--layout separate,paired] [--ubatch N] [--models DIR]
#                                   [--upstream DIR]
#   --size      the synthetic model pair (spark-convert --synthetic spark-gemma2-SIZE and
#               gemma2-SIZE, Q8_0, made once in --models)                        default: 9b
#   --leave     the budgets (GB left to llama-bench, as MemAvailable counts it); "all" runs
#               without a holder. Default: all, then from Spark's file (memory-budget.py --sizes):
#               always + rows + overhead (its whole FFN pool fits), always + rows / 2 + overhead,
#               1.1 x always + overhead
#   --overhead  GB the process needs besides the file (KV cache, compute buffers)   default: 0.6
#   --repack    llama-bench --repack values (1: ggml's repacked / AMX weights, anonymous memory
#               that must fit; 0: every weight memory-mapped)                     default: 0,1
#   --paging    SPARK_PAGING values for Spark's runs, one column each (auto: rows requested
#               from storage ahead of use when not in memory; never: the kernel's own paging,
#               as before issue 55); ratios use the first                     default: auto
#   --layout    Spark files, one column each per paging value: separate (K2 and V as two
#               tensors, spark-convert's default), paired (spark-convert --pair-k2v: a
#               neuron's K2 and V rows side by side, one read each); ratios use the first
#                                                                           default: separate
#   -n -p -r    as llama-bench                                     default: 16 / 0 / 1
#   --ubatch N  llama-bench -b N -ub N (a prompt over 512 tokens in one ubatch: the sparse
#               FFN's two-stage path)                         default: llama-bench's 2048 / 512
#   --models DIR    where the models are made                      default: target/bench-models
#   --upstream DIR  what tools/upstream.sh installed               default: target/upstream
# Before each run under a budget the model files' pages are dropped from the page cache
# (memory-budget.py --evict, every file of the run), so each starts cold; before each "all" run the file is read into
# the page cache (the in-memory speed). A run the kernel kills (it did not fit) is reported.
# Prints the CPU, the storage's cold sequential read rate of the model file, the files' always/
# rows split, then one row per (budget, repack): Spark and stock t/s and their ratio, and Spark's
# speed as a share of its in-memory ("all") speed.
set -euo pipefail
cd "$(dirname "$0")/.."

size=9b leaves="" repacks=0,1 gen=16 prompt=0 reps=1 overhead=0.6 pagings=auto layouts=separate
batch=()
models=target/bench-models upstream=target/upstream
while [ $# -gt 0 ]; do
    case "$1" in
        --size) size=$2; shift 2 ;;
        --leave) leaves=$2; shift 2 ;;
        --repack) repacks=$2; shift 2 ;;
        --overhead) overhead=$2; shift 2 ;;
        --paging) pagings=$2; shift 2 ;;
        --layout) layouts=$2; shift 2 ;;
        -n) gen=$2; shift 2 ;;
        -p) prompt=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --ubatch) batch=(-b "$2" -ub "$2"); shift 2 ;;
        --models) models=$2; shift 2 ;;
        --upstream) upstream=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "bench-memory: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$size" in 2b|9b) ;; *) echo "bench-memory: --size is 2b or 9b, not '$size'" >&2; exit 2 ;; esac

upstream=$(realpath "$upstream")  # absolute: the plugin's path goes to llama-bench's environment
bench=$upstream/bin/llama-bench
plugin=$upstream/lib/libggml-spark.so
# shellcheck source=tools/bench-common.sh
source tools/bench-common.sh
bench_need "$bench" "$plugin"
bench_python
bench_models "$models" "$size"
IFS=, read -r -a layout_list <<<"$layouts"
declare -A spark_of=([separate]=$spark)
for l in "${layout_list[@]}"; do
    case "$l" in
        separate) ;;
        paired) spark_of[paired]=$(bench_paired_model "$models" "$size") ;;
        *) echo "bench-memory: --layout takes separate, paired, not '$l'" >&2; exit 2 ;;
    esac
done
spark=${spark_of[${layout_list[0]}]}
all_models=("$stock")
for l in "${layout_list[@]}"; do all_models+=("${spark_of[$l]}"); done

budget="$python tools/memory-budget.py --quiet"
size_of() { $python tools/memory-budget.py --sizes "$1" | awk -v k="$2" '$1 == k { print $2 }'; }
always=$(size_of "$spark" always) rows=$(size_of "$spark" rows)
if [ -z "$leaves" ]; then
    leaves=$(awk -v a="$always" -v r="$rows" -v o="$overhead" \
        'BEGIN { printf "all,%.1f,%.1f,%.1f", a + r + o, a + r / 2 + o, 1.1 * a + o }')
fi

# cold sequential read of the Spark file: what storage gives a reader that streams it
$budget --evict "$spark"
t0=$(date +%s.%N)
cat "$spark" >/dev/null
seq_gbs=$(awk -v t0="$t0" -v t1="$(date +%s.%N)" -v b="$(stat -c %s "$spark")" \
    'BEGIN { printf "%.2f", b / 1e9 / (t1 - t0) }')

echo "CPU: $(bench_cpu); MemAvailable $(awk '/MemAvailable/ { printf "%.1f", $2 / 1e6 }' /proc/meminfo) GB"
echo "storage: cold sequential read of $(basename "$spark") at $seq_gbs GB/s"
echo "Spark $size q8_0: $(size_of "$spark" total) GB = always-read $always GB + FFN rows $rows GB" \
     "(a token reads ~8 % of the rows); stock: $(size_of "$stock" total) GB, all read per token"
echo "llama-bench -n $gen -p $prompt ${batch[*]} -r $reps -t 2; the file evicted before each run under a budget, read into memory before \"all\""
echo
IFS=, read -r -a paging_list <<<"$pagings"
for p in "${paging_list[@]}"; do
    case "$p" in auto|always|never) ;; *) echo "bench-memory: --paging takes auto, always, never, not '$p'" >&2; exit 2 ;; esac
done
head="| GB left | repack |" rule="|---|---|"
for l in "${layout_list[@]}"; do
    for p in "${paging_list[@]}"; do head+=" Spark t/s ($l, paging $p) |"; rule+="---|"; done
done
echo "$head stock t/s | Spark / stock | Spark vs its in-RAM speed |"
echo "$rule---|---|---|"

# llama-bench's tg (or pp) t/s of one model under one budget; "killed", "failed" or "no-plugin" otherwise
run_one() {
    local model=$1 leave=$2 repack=$3 with_plugin=$4 paging=${5:-auto} out rc=0 hold=()
    # every model of the run is evicted, not only this one: pages another run left in the page
    # cache would be reclaimed during this run's reads (kswapd's time on these 2 cores)
    local evict=() f
    for f in "${all_models[@]}"; do evict+=(--evict "$f"); done
    [ "$leave" = all ] || hold=($budget --leave "$leave" "${evict[@]}" --)
    [ "$leave" = all ] && cat "$model" >/dev/null  # in memory: the file read into the page cache
    local env=()
    [ "$with_plugin" = 1 ] && env=(GGML_BACKEND_PATH="$plugin" SPARK_PAGING="$paging")
    out=$(env "${env[@]}" "${hold[@]}" "$bench" -m "$model" -n "$gen" -p "$prompt" "${batch[@]}" -r "$reps" \
        -t 2 --repack "$repack" -o jsonl 2>/dev/null) || rc=$?
    if [ "$rc" -ge 128 ]; then echo killed; return; fi
    [ "$rc" = 0 ] || { echo failed; return; }
    # a Spark run whose plugin did not load ran the dense stock-op graph: not Spark's figure
    echo "$out" | "$python" -c 'import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
spark = sys.argv[1] == "1"
if not rows:
    print("failed")
elif spark and "Spark" not in rows[-1].get("backends", ""):
    print("no-plugin")
else:
    print("%.2f" % rows[-1]["avg_ts"])' "$with_plugin"
}

declare -A in_ram
IFS=, read -r -a leave_list <<<"$leaves"
IFS=, read -r -a repack_list <<<"$repacks"
for leave in "${leave_list[@]}"; do
    for repack in "${repack_list[@]}"; do
        cols="" s=""
        for l in "${layout_list[@]}"; do
            for p in "${paging_list[@]}"; do
                t=$(run_one "${spark_of[$l]}" "$leave" "$repack" 1 "$p")
                cols+=" $t |"
                [ -n "$s" ] || s=$t
            done
        done
        k=$(run_one "$stock" "$leave" "$repack" 0)
        [ "$leave" = all ] && in_ram[$repack]=$s
        ratio=$(awk -v s="$s" -v k="$k" 'BEGIN { if (s + 0 > 0 && k + 0 > 0) printf "%.2fx", s / k; else print "-" }')
        share=$(awk -v s="$s" -v r="${in_ram[$repack]:-}" 'BEGIN { if (s + 0 > 0 && r + 0 > 0) printf "%.0f %%", 100 * s / r; else print "-" }')
        echo "| $leave | $repack |$cols $k | $ratio | $share |"
    done
done
