#!/usr/bin/env bash
# Spark and stock Gemma-2 over ggml's RPC backend, in one run: upstream llama-bench locally and
# with every layer on a loopback rpc-server (--rpc 127.0.0.1:PORT -ngl 99), the server with the
# Spark plugin (the sparse kernels run in the server, patch 0009), without it (the client keeps
# the Spark nodes and copies their weights back: what patch 0007 alone did), and neither side
# with it (the dense stock-op graph, all in the server). Synthetic Gemma-2 2B shapes (Q8_0).
# The last two rows run with --repack 0: plain weights, no AMX or repacked buffers on either side
# (over RPC, the server's extra buffer types are what patch 0013 makes reachable).
#
# Usage: bash tools/bench-rpc.sh [-n 32] [-d 512] [-t 2] [-r 2] [--client-threads 1]
#                                [--upstream DIR] [--models DIR]
#   -n/-d/-r/-t  as llama-bench (decode tgN @ dD); -t: local runs and the servers  default: 32 / 512 / 2 / 2
#   --client-threads N  threads of llama-bench in the RPC runs: with -ngl 99 it computes next to
#                       nothing, and on one machine its threads would take the server's cores  default: 1
#   --upstream DIR  what tools/upstream.sh installed     default: target/upstream
#   --models DIR    where the two models are made once  default: target/bench-models
# Prints a markdown table: ms per token and the ratio to local Spark with the plugin.
set -euo pipefail
cd "$(dirname "$0")/.."

gen=32 depth=512 threads=2 client_threads=1 reps=2 upstream=target/upstream models=target/bench-models
while [ $# -gt 0 ]; do
    case "$1" in
        -n) gen=$2; shift 2 ;;
        -d) depth=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        --client-threads) client_threads=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --upstream) upstream=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-rpc: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

bench=$upstream/bin/llama-bench
server_bin=$upstream/bin/rpc-server
plugin=$upstream/lib/libggml-spark.so
# shellcheck source=tools/bench-common.sh
source tools/bench-common.sh
bench_need "$bench" "$server_bin" "$plugin"
bench_models "$models"
bench_python
mkdir -p target/bench-rpc
out=target/bench-rpc

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
# not in $(...): a subshell's pids+= would not reach the cleanup trap, and the servers would outlive the run
start_server() { # start_server NAME WITH_PLUGIN -> sets $endpoint
    local port; port=$(free_port)
    if [ "$2" = 1 ]; then
        GGML_BACKEND_PATH=$plugin "$server_bin" -H 127.0.0.1 -p "$port" -t "$threads" >"$out/$1.log" 2>&1 &
    else
        "$server_bin" -H 127.0.0.1 -p "$port" -t "$threads" >"$out/$1.log" 2>&1 &
    fi
    pids+=($!)
    for _ in $(seq 1 100); do
        if "$python" -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null; then
            endpoint="127.0.0.1:$port"; return
        fi
        sleep 0.1
    done
    echo "bench-rpc: rpc-server $1 did not start (see $out/$1.log)" >&2; exit 1
}
start_server with-plugin 1; with_plugin_ep=$endpoint
start_server without-plugin 0; without_ep=$endpoint
echo "bench-rpc: $(bench_cpu), -t $threads, servers $with_plugin_ep (plugin), $without_ep (none)" >&2

run() { # run NAME CLIENT_PLUGIN MODEL [ARGS...]
    local name=$1 client_plugin=$2 model=$3; shift 3
    local t=$threads
    case "$name" in *rpc*) t=$client_threads ;; esac
    echo "bench-rpc: $name" >&2
    if [ "$client_plugin" = 1 ]; then
        GGML_BACKEND_PATH=$plugin "$bench" -m "$model" -p 0 -n "$gen" -d "$depth" -t "$t" -r "$reps" -o json "$@" >"$out/$name.json"
    else
        "$bench" -m "$model" -p 0 -n "$gen" -d "$depth" -t "$t" -r "$reps" -o json "$@" >"$out/$name.json"
    fi
}
# Spark and stock alternate within each configuration.
run spark-local 1 "$spark"
run stock-local 0 "$stock"
run spark-rpc-plugin 1 "$spark" --rpc "$with_plugin_ep" -ngl 99
run stock-rpc 0 "$stock" --rpc "$without_ep" -ngl 99
run spark-rpc-server-without 1 "$spark" --rpc "$without_ep" -ngl 99
run spark-rpc-dense 0 "$spark" --rpc "$without_ep" -ngl 99
run spark-local-dense 0 "$spark"
# plain weights on both sides (no AMX / repacked buffer types): what RPC gave before patch 0013
run spark-local-norepack 1 "$spark" --repack 0
run spark-rpc-plugin-norepack 1 "$spark" --rpc "$with_plugin_ep" -ngl 99 --repack 0

"$python" - "$out" "$gen" "$depth" <<'EOF'
import json, sys
out, gen, depth = sys.argv[1], sys.argv[2], sys.argv[3]
def ms(name):
    rows = json.load(open(f"{out}/{name}.json"))
    return 1000.0 / rows[0]["avg_ts"]
base = ms("spark-local")
rows = [
    ("Spark, local, plugin", "spark-local"),
    ("Spark, local, no plugin (dense graph)", "spark-local-dense"),
    ("Spark, RPC, plugin in client and server", "spark-rpc-plugin"),
    ("Spark, RPC, plugin in the client only", "spark-rpc-server-without"),
    ("Spark, RPC, no plugin (dense graph)", "spark-rpc-dense"),
    ("Spark, local, plugin, --repack 0", "spark-local-norepack"),
    ("Spark, RPC, plugin in client and server, --repack 0", "spark-rpc-plugin-norepack"),
    ("stock Gemma-2, local", "stock-local"),
    ("stock Gemma-2, RPC", "stock-rpc"),
]
print(f"| tg{gen} @ d{depth}, Gemma-2 2B shapes Q8_0 | ms/token | vs Spark local |")
print("|---|---|---|")
for label, name in rows:
    t = ms(name)
    print(f"| {label} | {t:.1f} | {t / base:.2f}x |")
EOF
