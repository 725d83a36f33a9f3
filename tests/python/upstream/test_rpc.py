"""ggml's RPC backend with a Spark model: ggml-rpc-server (installed also as rpc-server) on
127.0.0.1, and llama-completion / llama-perplexity offloading layers to it (--rpc HOST:PORT
-ngl N [-ts ...]) give what they give locally.

Where the Spark kernels run: they are ggml custom ops whose nodes carry their parameters in their
own op_params (spark_op_set_params, patch 0002) and no pointer of the client, and the plugin
registers them by name with ggml-rpc (patch 0009). A server started with the plugin
(GGML_BACKEND_PATH=... rpc-server) has registered the same names, so the client sends the Spark
nodes of the layers it offloaded to it and the server runs them next to their weights: its
SPARK_STATS table (printed when it is ended by SIGTERM) shows those layers, the client's shows
the layers it kept. A server without the plugin (or whose plugin refused its ggml) has not: the
client keeps the Spark nodes on its own CPU and the scheduler copies their weights back for
every evaluation, as before patch 0009 (correct, slow). The byte counts over the connection are
measured through a counting proxy. Timings are printed, not asserted (README, "Upstream
llama.cpp" has the measured table)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from upstream_helpers import (CFG, HELDOUT, TARGET_KEEP, THREADS, UPSTREAM, assert_stats_table,
                              describe, exit_status, free_port, llama_completion, llama_perplexity,
                              parse_stats, stat, tail, tool, tool_env)

PROMPT = "ROMEO:"
N_PREDICT = 24
N_LAYERS = CFG["n_layers"]
REFUSED = "spark-backend: not registering the Spark kernels"


@dataclass
class RpcServer:
    """An rpc-server on 127.0.0.1 with its log; `stop()` ends it with SIGTERM (the plugin prints
    its SPARK_STATS table then) and returns the whole log."""
    endpoint: str
    proc: subprocess.Popen
    args: list
    env: dict
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def explain(self, what: str) -> str:
        return (f"{what}\nrpc server: {describe(self.args, self.env)}\n--- its log ---\n"
                f"{tail(self.log())}")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log()


def start_rpc_server(workdir: Path, with_plugin: bool, binary: Path | None = None,
                     name: str = "rpc-server", extra_args: tuple = (),
                     extra_env: dict | None = None) -> RpcServer:
    port = free_port()
    args = [str(binary or tool("rpc-server")), "-H", "127.0.0.1", "-p", str(port), "-t", THREADS,
            *extra_args]
    env = {**tool_env(with_plugin, stats=with_plugin), **(extra_env or {})}
    log_path = workdir / f"{name}-{port}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    server = RpcServer(f"127.0.0.1:{port}", proc, args, env, log_path)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            pytest.fail(server.explain(f"rpc-server exited ({exit_status(proc.returncode)})"),
                        pytrace=False)
        # the server prints its banner before it listens; wait for the socket instead
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                pytest.fail(server.explain("rpc-server not listening after 30 s"), pytrace=False)
            time.sleep(0.1)


@pytest.fixture
def servers(tmp_path):
    """Starts rpc-servers on demand (`servers(with_plugin)`) and stops every one at the end."""
    started = []

    def start(with_plugin: bool, **kw) -> RpcServer:
        s = start_rpc_server(tmp_path, with_plugin, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def offloaded(res) -> tuple[int, int]:
    """(offloaded, total) layers from llama.cpp's load log (at -lv 4)."""
    m = re.search(r"offloaded (\d+)/(\d+) layers", res.stderr)
    assert m, res.explain("no 'offloaded N/M layers' in the log")
    return int(m.group(1)), int(m.group(2))


def rpc_completion(model, servers: list[RpcServer], with_plugin: bool, *extra, ngl="99"):
    """llama-completion greedy text with `ngl` layers on the RPC devices; fails with every log
    when the client or a server fails."""
    endpoints = ",".join(s.endpoint for s in servers)
    text, res = llama_completion(model, PROMPT, N_PREDICT, with_plugin, "--rpc", endpoints, "-ngl",
                                 ngl, "-lv", "4", *extra, check=False)
    dead = [s for s in servers if s.proc.poll() is not None]
    if res.returncode != 0 or dead:
        logs = "\n".join(s.explain(f"server {s.endpoint}: "
                                   f"{'exited ' + exit_status(s.proc.returncode) if s.proc.poll() is not None else 'running'}")
                         for s in servers)
        pytest.fail(res.explain(f"llama-completion --rpc {endpoints} -ngl {ngl} failed (exit status "
                                f"{exit_status(res.returncode)})\n{logs}"), pytrace=False)
    for s in servers:
        assert re.search(rf"RPC\d+\[{re.escape(s.endpoint)}\] model buffer size", res.stderr), \
            res.explain(f"nothing of the model on the RPC device of {s.endpoint}")
    return text, res


def layers_that_ran(text: str) -> set[int]:
    """The layers whose sparse kernels ran in a process, from its SPARK_STATS table."""
    return {layer for layer, row in parse_stats(text).rows.items()
            if row.tokens > 0 or row.attn_queries > 0}


def test_rpc_offload_on_the_dense_graph(shipped_f32, servers):
    """Without the plugin: stock ops only, all of them executed by the RPC server."""
    server = servers(False)
    local, local_res = llama_completion(shipped_f32, PROMPT, N_PREDICT, False)
    remote, remote_res = rpc_completion(shipped_f32, [server], False)
    print(f"\ndense graph: local {local_res.seconds:.2f} s, rpc {remote_res.seconds:.2f} s")
    assert remote == local, (remote, local)


def test_rpc_offload_with_the_plugin_gives_the_local_text(shipped_f32, servers):
    """Plugin in the client and the server: the Spark nodes run in the server, next to their
    weights; the client's table shows no Spark kernel, the server's every layer."""
    server = servers(True)
    local, local_res = llama_completion(shipped_f32, PROMPT, N_PREDICT, True)
    remote, remote_res = rpc_completion(shipped_f32, [server], True)
    done, total = offloaded(remote_res)
    assert done == total, remote_res.explain(f"not every layer on the RPC device ({done}/{total})")
    server_log = server.stop()
    print(f"\nsparse: local {local_res.seconds:.2f} s, rpc {remote_res.seconds:.2f} s\n"
          f"server's spark-stats:\n" + "\n".join(parse_stats(server_log).lines))
    assert remote == local, remote_res.explain(
        f"--rpc {server.endpoint} -ngl 99 gave\n  {remote!r}\nlocally\n  {local!r}")
    assert parse_stats(remote_res.stderr).none_ran, remote_res.explain(
        "the client ran Spark kernels although every layer is on the RPC server")
    assert_stats_table(server_log, N_LAYERS, TARGET_KEEP,
                       explain=lambda what: server.explain(f"the server's table: {what}"))


def test_rpc_server_without_the_plugin_keeps_the_spark_nodes_local(shipped_f32, servers):
    """The old behaviour: the server has no named Spark ops, so the client runs them itself."""
    server = servers(False)
    local, _ = llama_completion(shipped_f32, PROMPT, N_PREDICT, True)
    remote, remote_res = rpc_completion(shipped_f32, [server], True)
    server_log = server.stop()
    assert remote == local, (remote, local)
    assert_stats_table(remote_res.stderr, N_LAYERS, TARGET_KEEP, explain=remote_res.explain)
    assert "spark-stats" not in server_log, server.explain("a server without the plugin printed")
    # and the client says so, once per load (spark-gemma2's load_tensors)
    said = re.findall(r"spark-gemma2: layers (\d+)-(\d+) are on (\S+), which does not run the "
                      r"Spark ops: their Spark nodes run on the CPU", remote_res.stderr)
    assert said == [("0", str(N_LAYERS - 1), f"RPC0[{server.endpoint}]")], remote_res.explain(
        f"the load line for layers 0..{N_LAYERS - 1} on the server without the plugin: {said}")


def test_two_servers_and_the_client_split_the_layers(shipped_f32, servers):
    """-ngl 4 (llama.cpp counts the output layer as one: layers 3-5 and the output) over two
    servers (-ts 1,1): layers 0-2 stay in the client, the others go to the servers two by two;
    each process runs the Spark kernels of its own layers, and the text is the local one."""
    a, b = servers(True), servers(True)
    local, _ = llama_completion(shipped_f32, PROMPT, N_PREDICT, True)
    remote, res = rpc_completion(shipped_f32, [a, b], True, "-ts", "1,1", ngl="4")
    assert remote == local, (remote, local)
    ran = {"client": layers_that_ran(res.stderr), a.endpoint: layers_that_ran(a.stop()),
           b.endpoint: layers_that_ran(b.stop())}
    print(f"\nlayers run by each process: {ran}")
    assert all(ran.values()), res.explain(f"a process ran no Spark layer: {ran}")
    union = set().union(*ran.values())
    assert union == set(range(N_LAYERS)), ran
    assert sum(len(v) for v in ran.values()) == N_LAYERS, f"a layer ran twice: {ran}"
    assert ran["client"] == set(range(N_LAYERS + 1 - 4)), ran


# ---------------------------------------------------------------------------------------------
# the server's repacked weights (patch 0013)


def model_buffers(stderr: str) -> dict[str, float]:
    """{buffer type: MiB} of the model buffers in llama.cpp's load log (at -lv 4)."""
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB", stderr)}


def test_a_quantized_model_uses_the_servers_repacked_weights(shipped_quantized, servers):
    """Q8_0: a local CPU keeps the weights of the stock matrix products (attention, the K1
    predictor, the output) in an extra buffer type, repacked for its kernels (AMX_INT8 or
    CPU_REPACK, where the CPU has one), and K2/V plain (the Spark kernels read their rows). Over
    RPC the server offers its extra types and the client puts the same weights in the server's
    (RPC0[host:port]_AMX ...); the server runs the repacked kernels, the text is the local one.
    With --no-repack neither side repacks, and the text is the same again."""
    q8 = shipped_quantized("Q8_0")
    local, local_res = llama_completion(q8, PROMPT, N_PREDICT, True, "-lv", "4")
    extras = set(model_buffers(local_res.stderr)) - {"CPU", "CPU_Mapped"}
    if not extras:
        pytest.skip(f"this CPU repacks no Q8_0 weight: {model_buffers(local_res.stderr)}")
    server = servers(True)
    remote, res = rpc_completion(q8, [server], True)
    on_server = {name.split("]_", 1)[1] for name in model_buffers(res.stderr)
                 if name.startswith("RPC") and f"[{server.endpoint}]_" in name}
    assert on_server == extras, res.explain(
        f"local extra buffer types {extras}, the server's used over RPC {on_server}")
    assert remote == local, res.explain(f"--rpc gave\n  {remote!r}\nlocally\n  {local!r}")
    plain, plain_res = rpc_completion(q8, [server], True, "--no-repack")
    assert not [n for n in model_buffers(plain_res.stderr) if "]_" in n], plain_res.explain(
        "--no-repack still put weights in an extra buffer type of the server")
    assert plain == local, plain_res.explain(f"--no-repack gave\n  {plain!r}\nlocally\n  {local!r}")
    assert layers_that_ran(server.stop()) == set(range(N_LAYERS)), server.explain("server table")


# ---------------------------------------------------------------------------------------------
# logits


def test_rpc_logits_equal_the_local_ones(shipped_f32, servers, tmp_path):
    """llama-perplexity's KL divergence of the RPC run (plugin on both sides, every layer on the
    server) against the local run as its base: the base file rounds log-probabilities to 16 bits,
    so 'equal' is the model-against-itself bound of test_perplexity.py."""
    server = servers(True)
    base = tmp_path / "local.kld"
    common = [shipped_f32, "-c", "256", "-b", "256", "--chunks", "4"]
    llama_perplexity(*common, "-f", HELDOUT, "--kl-divergence-base", base)
    res = llama_perplexity(*common, "--kl-divergence-base", base, "--kl-divergence", "--rpc",
                           server.endpoint, "-ngl", "99")
    assert stat(res, "Mean    KLD") <= 1e-4, res.stdout
    assert stat(res, "Maximum KLD") <= 1e-3, res.stdout
    assert stat(res, "Same top p") == pytest.approx(100.0), res.stdout
    assert layers_that_ran(server.stop()) == set(range(N_LAYERS)), server.explain("server table")


def test_rpc_server_reads_a_quantized_cache(shipped_f32, servers):
    """`-fa on -ctk q8_0 -ctv q8_0` with every layer and the KV cache on a server with the
    plugin: its Spark ops read the q8_0 cache it holds, and the text is the local one."""
    server = servers(True)
    flags = ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]
    local, _ = llama_completion(shipped_f32, PROMPT, N_PREDICT, True, *flags)
    remote, remote_res = rpc_completion(shipped_f32, [server], True, *flags)
    server_log = server.stop()
    assert remote == local, remote_res.explain(f"--rpc gave {remote!r}, locally {local!r}")
    assert layers_that_ran(server_log) == set(range(N_LAYERS)), server.explain("server table")


# ---------------------------------------------------------------------------------------------
# a server whose ggml is another build


@pytest.fixture
def other_ggml_server_binary(tmp_path) -> Path:
    """rpc-server with a copy of the installed libraries whose ggml_commit() is another build's
    (the series tag in libggml-base changed): what the plugin's version check sees in a process
    of another llama.cpp build."""
    root = tmp_path / "other-ggml"
    shutil.copytree(UPSTREAM / "lib", root / "lib", symlinks=True)
    (root / "bin").mkdir()
    shutil.copy2(tool("ggml-rpc-server"), root / "bin" / "rpc-server")
    base = (root / "lib" / "libggml-base.so.0").resolve()
    data = base.read_bytes()
    tags = set(re.findall(rb"spark-[0-9a-f]{12}\x00", data))
    assert len(tags) == 1, f"{base}: want one series tag string, found {tags}"
    (tag,) = tags
    other = b"spark-" + bytes(reversed(tag[6:18])) + b"\x00"
    if other == tag:
        other = b"spark-000000000000\x00"
    base.write_bytes(data.replace(tag, other))
    return root / "bin" / "rpc-server"


def test_a_server_with_another_ggml_refuses_the_plugin_and_the_client_keeps_the_nodes(
        shipped_f32, servers, other_ggml_server_binary):
    server = servers(True, binary=other_ggml_server_binary, name="other-ggml")
    local, _ = llama_completion(shipped_f32, PROMPT, N_PREDICT, True)
    remote, res = rpc_completion(shipped_f32, [server], True)
    log = server.stop()
    refusals = [line for line in log.splitlines() if line.startswith(REFUSED)]
    assert len(refusals) == 1, server.explain(f"want one '{REFUSED}' line, got {refusals}")
    assert "spark-stats" not in log, server.explain("the refused plugin printed statistics")
    assert remote == local, (remote, local)
    assert_stats_table(res.stderr, N_LAYERS, TARGET_KEEP, explain=res.explain)


# ---------------------------------------------------------------------------------------------
# what crosses the connection


class CountingProxy:
    """A TCP relay 127.0.0.1:port -> target that counts the bytes of every connection in each
    direction (to_server: client -> server)."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.to_server = 0
        self.to_client = 0
        self.lock = threading.Lock()
        self.pumps: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for args in ((client, server, "to_server"), (server, client, "to_client")):
                pump = threading.Thread(target=self._pump, args=args, daemon=True)
                with self.lock:
                    self.pumps.append(pump)
                pump.start()

    def _pump(self, src, dst, counter):
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                with self.lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def drained(self, timeout: float = 60.0) -> tuple[int, int]:
        """(to_server, to_client) once every relay has ended: the client has exited, so each of
        its connections closes and both of its pumps stop (a fixed wait could read the counts
        before the last bytes were relayed)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            pumps = list(self.pumps)
        for pump in pumps:
            pump.join(max(0.0, deadline - time.monotonic()))
        alive = sum(p.is_alive() for p in pumps)
        assert not alive, f"{alive} of {len(pumps)} relays still open {timeout} s after the client exited"
        with self.lock:
            return self.to_server, self.to_client

    def close(self):
        self.listener.close()


def bytes_of_run(model, server: RpcServer, with_plugin: bool, n: int) -> tuple[int, int]:
    proxy = CountingProxy(server.endpoint)
    try:
        # One run: a retry after a lost capture would send the model's weights through the
        # proxy a second time (seen on a busy machine: 22 MB more in a 40-token run).
        llama_completion(model, PROMPT, n, with_plugin, "--rpc", proxy.endpoint, "-ngl", "99",
                         "--ignore-eos", once=True)
        return proxy.drained()
    finally:
        proxy.close()


@pytest.mark.parametrize("qtype, bytes_per_weight", [("F32", 4.0), ("Q8_0", 34 / 32)])
def test_no_weight_crosses_the_connection_after_load(shipped_f32, shipped_quantized, servers,
                                                     qtype, bytes_per_weight):
    """Bytes per generated token (the difference of a 40- and an 8-token run, load alike): with
    the plugin in the server, activations and logits only, far less than one layer's FFN
    weights; with a server without it, the Spark nodes' weights come back for every evaluation.
    Q8_0: the same with the server's repacked (extra) buffers, whose supports_op answers the
    client keeps."""
    model = shipped_f32 if qtype == "F32" else shipped_quantized(qtype)
    d, f, r = CFG["d_model"], CFG["d_ff"], CFG["ffn_r"]
    ffn_bytes = bytes_per_weight * ((d - r) * f + d * f)  # K2 and V of one layer
    rows = {}
    for name, with_plugin_on_server in (("plugin in the server", True), ("server without", False)):
        server = servers(with_plugin_on_server)
        short = bytes_of_run(model, server, True, 8)
        long = bytes_of_run(model, server, True, 40)
        rows[name] = tuple((b - a) / 32 for a, b in zip(short, long))
        server.stop()
    print(f"\n{qtype}: bytes per token over the connection (to server, to client); one layer's "
          f"K2 + V: {ffn_bytes:.0f}")
    for name, (up, down) in rows.items():
        print(f"  {name}: {up:.0f}, {down:.0f}")
    up, down = rows["plugin in the server"]
    assert up + down < ffn_bytes / 8, rows
    old_up, old_down = rows["server without"]
    assert old_down > N_LAYERS * ffn_bytes, rows  # every layer's K2 and V, every token
