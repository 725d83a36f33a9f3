#!/usr/bin/env bash
# Gemma 3n with and without the Spark plugin, alternated: N rounds, each one llama-bench run of
# stock llama.cpp and one with GGML_BACKEND_PATH set (the order flips every round), on the same
# file. Prints each round's tokens/s per test and ratio, then per test the median ratio and the
# range: on a shared, noisy VM one pair of runs can move a 1.1x ratio by +-0.03.
#
# Usage: bash tools/bench-gemma3n.sh MODEL.gguf [-n ROUNDS] [-t THREADS] [-- LLAMA-BENCH ARGS]
#   default rounds 4, threads 2, llama-bench args "-p 0 -n 128 -r 2" (decode at depth 0).
#   Make an E2B-shaped file with: .venv/bin/python tools/gemma3n-synth.py e2b e2b-q8_0.gguf --outtype q8_0
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh
rounds=4 threads=2 model=
while [ $# -gt 0 ]; do
    case "$1" in
        -n) rounds=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "bench-gemma3n: unknown argument '$1' (see --help)" >&2; exit 2 ;;
        *) model=$1; shift ;;
    esac
done
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(-p 0 -n 128 -r 2)
[ -n "$model" ] || { echo "bench-gemma3n: give a Gemma 3n GGUF (see --help)" >&2; exit 2; }
[ -f "$model" ] || { echo "bench-gemma3n: $model: no such file" >&2; exit 1; }
bench=target/upstream/bin/llama-bench plugin=$PWD/target/upstream/lib/libggml-spark.so
bench_need "$bench" "$plugin"
bench_python

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bench-gemma3n: $(bench_cpu); $model; llama-bench -t $threads ${bench_args[*]}; $rounds rounds" >&2
for round in $(seq 1 "$rounds"); do
    order="stock spark"
    [ $((round % 2)) = 0 ] && order="spark stock"
    for side in $order; do
        echo "bench-gemma3n: round $round/$rounds, $side" >&2
        if [ "$side" = spark ]; then
            GGML_BACKEND_PATH=$plugin "$bench" -m "$model" -t "$threads" "${bench_args[@]}" -o jsonl \
                >"$out/$round-$side.jsonl" 2>"$out/$round-$side.log" \
                || { tail -5 "$out/$round-$side.log" >&2; exit 1; }
        else
            "$bench" -m "$model" -t "$threads" "${bench_args[@]}" -o jsonl \
                >"$out/$round-$side.jsonl" 2>"$out/$round-$side.log" \
                || { tail -5 "$out/$round-$side.log" >&2; exit 1; }
        fi
    done
done

"$python" - "$out" "$rounds" <<'EOF'
import json, pathlib, statistics, sys

out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])

def speeds(path):
    """{test name: tokens/s} of one llama-bench -o jsonl run."""
    result = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        name = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
        if row.get("n_depth"):
            name += f" @ d{row['n_depth']}"
        result[name] = row["avg_ts"]
    return result

ratios = {}
print("| round | test | stock t/s | Spark t/s | Spark / stock |")
print("|---|---|---|---|---|")
for r in range(1, rounds + 1):
    stock, spark = speeds(out / f"{r}-stock.jsonl"), speeds(out / f"{r}-spark.jsonl")
    for test in stock:
        ratio = spark[test] / stock[test]
        ratios.setdefault(test, []).append(ratio)
        print(f"| {r} | {test} | {stock[test]:.2f} | {spark[test]:.2f} | {ratio:.3f} |")
print()
for test, v in ratios.items():
    print(f"{test}: median {statistics.median(v):.3f}x, range {min(v):.3f}-{max(v):.3f}x over {len(v)} rounds")
EOF
