#!/usr/bin/env bash
# The shipped model's decode speed as a distribution: `spark run` N times (2 threads, 160 tokens,
# sampling as README's demo), alone and beside one busy process, sparse and --dense. Prints each
# run's tokens/s and, per set, the median, the slowest run and slowest/median (the project's
# target for small graphs: >= 0.6).
#
# Usage: bash tools/bench-small.sh [-r 30] [--spark BIN] [--model GGUF] [--modes sparse,dense]
#                                  [--busy 0|1|both]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=30 spark=target/debug/spark model=target/demo/spark-shakespeare-f32.gguf modes=sparse,dense busy=both
while [ $# -gt 0 ]; do
    case "$1" in
        -r) reps=$2; shift 2 ;;
        --spark) spark=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        --busy) busy=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-small: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$spark" ] || { echo "bench-small: $spark missing: cargo build" >&2; exit 1; }
if [ ! -f "$model" ]; then
    mkdir -p "$(dirname "$model")"
    target/debug/spark-convert models/spark-shakespeare.npz "$model" --outtype f32 --quiet
fi
case "$busy" in 0) loads=0 ;; 1) loads=1 ;; both) loads="0 1" ;; *) echo "bench-small: --busy 0|1|both" >&2; exit 2 ;; esac

for load in $loads; do
    busy_pid=
    if [ "$load" = 1 ]; then
        sh -c 'while :; do :; done' &
        busy_pid=$!
    fi
    for mode in ${modes//,/ }; do
        flag=; [ "$mode" = dense ] && flag=--dense
        speeds=()
        for _ in $(seq 1 "$reps"); do
            line=$("$spark" run -m "$model" -p "ROMEO:" -n 160 --temp 0.8 --top-k 40 --seed 7 -t 2 $flag 2>&1 >/dev/null | grep 'generation:')
            speeds+=("$(sed 's/.*(\([0-9.]*\) tokens\/s).*/\1/' <<<"$line")")
        done
        printf '%s\n' "${speeds[@]}" | python3 -c "
import sys, statistics
v = [float(x) for x in sys.stdin.read().split()]
m = statistics.median(v)
print(f'{\"beside one busy process\" if $load else \"alone\"}, {\"$mode\"}: median {m:.0f} t/s, slowest {min(v):.0f}, fastest {max(v):.0f}, slowest/median {min(v)/m:.2f}; runs: ' + ' '.join(f'{x:.0f}' for x in v))"
    done
    [ -n "$busy_pid" ] && kill "$busy_pid"
done
