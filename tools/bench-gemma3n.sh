#!/usr/bin/env bash
# Gemma 3n with and without the Spark plugin, alternated: N rounds, each one llama-bench run of
# stock llama.cpp and one with GGML_BACKEND_PATH set (the order flips every round), on the same
# file. Prints each round's tokens/s per test and ratio, then per test the median ratio and the
# range: on a shared, noisy VM one pair of runs can move a 1.1x ratio by +-0.03.
#
# Usage: bash tools/bench-gemma3n.sh MODEL.gguf [-n ROUNDS] [-t THREADS] [--plugin SO] [--quiet]
#                                    [-- LLAMA-BENCH ARGS]
#   default rounds 4, threads 2, llama-bench args "-p 0 -n 128 -r 2" (decode at depth 0);
#   progress on stderr (--quiet: none), the table on stdout; --plugin: another build of the
#   plugin (default target/upstream/lib/libggml-spark.so).
#   Make an E2B-shaped file with: .venv/bin/python tools/gemma3n-synth.py e2b e2b-q8_0.gguf --outtype q8_0
set -euo pipefail
rounds=4 threads=2 model= quiet=0 plugin=
while [ $# -gt 0 ]; do
    case "$1" in
        -n) [ $# -ge 2 ] || set -- -n ''; rounds=$2; shift 2 ;;
        -t) [ $# -ge 2 ] || set -- -t ''; threads=$2; shift 2 ;;
        --plugin)
            [ $# -ge 2 ] && [ -n "$2" ] || { echo "bench-gemma3n: --plugin needs a path" >&2; exit 2; }
            plugin=$2; shift 2 ;;
        --quiet) quiet=1; shift ;;
        --) shift; break ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "bench-gemma3n: unknown argument '$1' (see --help)" >&2; exit 2 ;;
        *) model=$1; shift ;;
    esac
done
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(-p 0 -n 128 -r 2)
for n in "$rounds" "$threads"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench-gemma3n: '$n' is not a count (-n ROUNDS, -t THREADS)" >&2; exit 2; }
done
[ -n "$model" ] || { echo "bench-gemma3n: give a Gemma 3n GGUF (see --help)" >&2; exit 2; }
[ -f "$model" ] || { echo "bench-gemma3n: $model: no such file" >&2; exit 1; }
model=$(realpath -- "$model")
if [ -n "$plugin" ]; then
    [ -f "$plugin" ] || { echo "bench-gemma3n: --plugin '$plugin': no such file" >&2; exit 1; }
    plugin=$(realpath -- "$plugin")
fi
cd "$(dirname "$0")/.."
. tools/bench-common.sh
bench=target/upstream/bin/llama-bench
[ -n "$plugin" ] || plugin=$PWD/target/upstream/lib/libggml-spark.so
bench_need "$bench" "$plugin"
bench_python

say() { [ "$quiet" = 1 ] || echo "bench-gemma3n: $*" >&2; }
# fail RUN MESSAGE: the end of that llama-bench run's log, then the message; exit 1
fail() { tail -n 15 "$1.log" >&2; echo "bench-gemma3n: $2" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
say "$(bench_cpu); $model; llama-bench -t $threads ${bench_args[*]}; $rounds rounds"
for round in $(seq 1 "$rounds"); do
    order="stock spark"
    [ $((round % 2)) = 0 ] && order="spark stock"
    for side in $order; do
        say "round $round/$rounds, $side"
        with=(env -u GGML_BACKEND_PATH)
        [ "$side" = spark ] && with=(env GGML_BACKEND_PATH="$plugin")
        run=$out/$round-$side
        "${with[@]}" "$bench" -m "$model" -t "$threads" "${bench_args[@]}" -o jsonl >"$run.jsonl" 2>"$run.log" \
            || fail "$run" "llama-bench failed (round $round, $side)"
        # a comparison of stock with stock says nothing: the Spark run must list the plugin's
        # backend in every record, the stock run in none
        with_spark=$(grep -c '"backends": "[^"]*Spark' "$run.jsonl" || true)
        records=$(grep -c . "$run.jsonl" || true)
        if [ "$side" = spark ] && [ "$with_spark" != "$records" ]; then
            fail "$run" "round $round: llama-bench ran without the Spark backend: the plugin did not load"
        elif [ "$side" = stock ] && [ "$with_spark" != 0 ]; then
            fail "$run" "round $round: the stock run has the Spark backend without GGML_BACKEND_PATH"
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

runs = [(speeds(out / f"{r}-stock.jsonl"), speeds(out / f"{r}-spark.jsonl")) for r in range(1, rounds + 1)]
ratios = {}
print("| round | test | stock t/s | Spark t/s | Spark / stock |")
print("|---|---|---|---|---|")
for r, (stock, spark) in enumerate(runs, start=1):
    for test in stock:
        ratio = spark[test] / stock[test]
        ratios.setdefault(test, []).append(ratio)
        print(f"| {r} | {test} | {stock[test]:.2f} | {spark[test]:.2f} | {ratio:.3f} |")
print()
for test, v in ratios.items():
    print(f"{test}: median {statistics.median(v):.3f}x, range {min(v):.3f}-{max(v):.3f}x over {len(v)} rounds")
EOF
