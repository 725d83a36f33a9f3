"""ggml's RPC backend with a Spark model: ggml-rpc-server (installed also as rpc-server) on
127.0.0.1, and llama-completion offloading every layer to it (--rpc HOST:PORT -ngl 99) gives the
text it gives locally: on the dense stock-op graph (no plugin) and with the Spark plugin.

Where the Spark kernels can run then: they are ggml custom ops, whose parameters hold a function
pointer into the client's copy of the plugin, so only the client's local CPU backend can execute
them; the RPC server (another process, without the plugin) never can. With the layers' weights
in the server's buffers, the scheduler has to keep the custom-op nodes on the local CPU backend
and copy the weights they read (ffn_up K2, ffn_down_t V) and their inputs back from the server
for each evaluation, while the stock ops (projections, norms, the predictor product) run
remotely; the plugin's table then shows every layer's sparse kernels having run locally. But
ggml-rpc's supports_op answers true for every op (ggml-rpc.cpp: "TODO: call the remote backend"),
so the scheduler assigns the custom nodes to the RPC device with their weights, and the server
executes the client's function pointer. The test asserts the behaviour wanted; the timings of
the local and the RPC runs are printed, not asserted."""

from __future__ import annotations

import re
import socket
import subprocess
import time

import pytest

from upstream_helpers import (CFG, TARGET_KEEP, THREADS, assert_stats_table, describe,
                              exit_status, free_port, llama_completion, parse_stats, tail, tool,
                              tool_env)

PROMPT = "ROMEO:"
N_PREDICT = 24


@pytest.fixture
def rpc_server(tmp_path):
    port = free_port()
    args = [str(tool("rpc-server")), "-H", "127.0.0.1", "-p", str(port), "-t", THREADS]
    env = tool_env(False, stats=False)  # the server process never has the Spark kernels
    log = open(tmp_path / "rpc-server.log", "w")
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)

    def explain(what):
        log.flush()
        return (f"{what}\nrpc server: {describe(args, env)}\n--- its log ---\n"
                f"{tail((tmp_path / 'rpc-server.log').read_text(errors='replace'))}")

    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(explain(f"rpc-server exited ({proc.returncode})"), pytrace=False)
            # the server prints its banner before it listens; wait for the socket instead
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(explain("rpc-server not listening after 30 s"), pytrace=False)
                time.sleep(0.1)
        yield f"127.0.0.1:{port}", proc, explain
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def offloaded(res) -> tuple[int, int]:
    """(offloaded, total) layers from llama.cpp's load log (at -lv 4)."""
    m = re.search(r"offloaded (\d+)/(\d+) layers", res.stderr)
    assert m, res.explain("no 'offloaded N/M layers' in the log")
    return int(m.group(1)), int(m.group(2))


def rpc_completion(endpoint, proc, explain, model, with_plugin):
    """llama-completion greedy text with every layer on the RPC device; fails with both logs
    when the client or the server fails."""
    text, res = llama_completion(model, PROMPT, N_PREDICT, with_plugin, "--rpc", endpoint, "-ngl",
                                 "99", "-lv", "4", check=False)
    server_rc = proc.poll()
    if res.returncode != 0 or server_rc is not None:
        pytest.fail(explain(res.explain(
            f"llama-completion --rpc {endpoint} -ngl 99 failed (exit status "
            f"{exit_status(res.returncode)}); the RPC server "
            f"{'is running' if server_rc is None else f'exited ({exit_status(server_rc)})'}")),
            pytrace=False)
    done, total = offloaded(res)
    assert done == total and f"RPC0[{endpoint}] model buffer size" in res.stderr, res.explain(
        f"not every layer on the RPC device ({done}/{total})")
    return text, res


def test_rpc_offload_on_the_dense_graph(shipped_f32, rpc_server):
    """Without the plugin: stock ops only, all of them executed by the RPC server."""
    endpoint, proc, explain = rpc_server
    local, local_res = llama_completion(shipped_f32, PROMPT, N_PREDICT, False)
    remote, remote_res = rpc_completion(endpoint, proc, explain, shipped_f32, False)
    print(f"\ndense graph: local {local_res.seconds:.2f} s, rpc {remote_res.seconds:.2f} s")
    assert remote == local, (remote, local)


def test_rpc_offload_with_the_plugin_gives_the_local_text(shipped_f32, rpc_server):
    endpoint, proc, explain = rpc_server
    local, local_res = llama_completion(shipped_f32, PROMPT, N_PREDICT, True)
    remote, remote_res = rpc_completion(endpoint, proc, explain, shipped_f32, True)
    print(f"\nsparse: local {local_res.seconds:.2f} s, rpc {remote_res.seconds:.2f} s\n"
          f"rpc run's spark-stats:\n" + "\n".join(parse_stats(remote_res.stderr).lines))
    assert remote == local, remote_res.explain(
        f"--rpc {endpoint} -ngl 99 gave\n  {remote!r}\nlocally\n  {local!r}")
    # which layers ran the sparse kernels (locally): all of them, on every token
    assert_stats_table(remote_res.stderr, CFG["n_layers"], TARGET_KEEP,
                       explain=remote_res.explain)
