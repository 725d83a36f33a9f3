"""Every door a person opens to run a Gemma 3n file with the Spark plugin: the tiny
random Gemma 3n of tools/gemma3n-synth.py (f32) through each way llama.cpp offers, with the
plugin (GGML_BACKEND_PATH) and, where a comparison makes sense, the same tool without it
(upstream's own gemma3n graph, every layer dense). Greedy text must be equal (f32 weights: see
test_sparse_ffn.py for why the q8_0 text is no fair test), and the plugin's SPARK_STATS table,
where the process prints one, must have rows for the 10 sparse FFN layers 0..9 only.

- llama-server: /completion and /v1/completions, the table at graceful shutdown (SIGINT); its
  web page in headless Chromium: a chat message typed, the reply shown = the API's.
- llama-cli: a one-turn chat from the shell (`-st -p`), the same reply with and without the plugin.
- llama-bench: a pp32/tg8 run with the plugin, its JSON records and the table.
- llama-cpp-python: `Llama(...)(prompt, temperature=0)` in its own Python process.
- ggml RPC: an rpc-server with the plugin runs the layers (and their spark_ffn_up nodes) of a
  llama-completion client that offloads every layer to it.
- damaged files: llama-completion with the plugin refuses a truncated file, a sparse layer's up
  matrix with the wrong shape and a missing one with llama.cpp's own load error (exit status 1),
  never a signal.

The spark-gemma2 tests of the same doors (tests/python/upstream/test_server.py,
test_quantize_bench.py, test_python.py, test_rpc.py) lend their helpers: upstream_helpers, and
test_python's / test_rpc's runners, loaded from their files."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from gemma3n_helpers import N_LAYER_SPARSE, ROOT, STD_MUL_KEEP, uh

PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak."
N_PREDICT = 24
GREEDY = {"temperature": 0, "seed": 1, "cache_prompt": False}
UPSTREAM_TESTS = ROOT / "tests" / "python" / "upstream"


def load_upstream_test(name: str):
    """tests/python/upstream/NAME.py as a module of its own name with a prefix (its functions,
    not its tests: nothing of it is bound in this module's namespace but the module)."""
    key = f"gemma3n_doors_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, UPSTREAM_TESTS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def assert_sparse_rows(stderr: str, explain, who: str) -> uh.Stats:
    """The plugin's table in `stderr` of `who`: one row per sparse layer 0..9 and none for the
    dense layers 10.. ; each with tokens, a keep rate within 1.5 points of 1 - Phi(1.645) = 5 %
    and no attention queries (Gemma 3n's attention stays upstream's)."""
    s = uh.parse_stats(stderr)
    assert s.header and not s.none_ran, explain(
        f"{who}: no spark-stats table (SPARK_STATS=1 with the plugin; got {s.lines}): did "
        f"spark_ffn_up run?")
    assert sorted(s.rows) == list(range(N_LAYER_SPARSE)), explain(
        f"{who}: spark-stats rows for layers {sorted(s.rows)}, want 0..{N_LAYER_SPARSE - 1} only")
    for layer, row in s.rows.items():
        assert row.tokens > 0, explain(f"{who}: layer {layer}: ffn_tokens = 0")
        assert abs(row.keep - STD_MUL_KEEP) <= 0.015, explain(
            f"{who}: layer {layer}: ffn_keep_rate {row.keep} not within 0.015 of "
            f"{STD_MUL_KEEP:.4f}")
        assert row.attn_queries == 0, explain(f"{who}: layer {layer}: a Spark attention row")
    return s


@pytest.fixture(scope="module")
def model(tiny) -> Path:
    return tiny["f32"]


@pytest.fixture(scope="module")
def local_text(model) -> dict[bool, str]:
    """with_plugin -> llama-completion's greedy text of PROMPT (the local reference); the two
    are equal (test_sparse_ffn.py's claim, checked again here since every door leans on it)."""
    stock, _ = uh.llama_completion(model, PROMPT, N_PREDICT, with_plugin=False)
    spark, res = uh.llama_completion(model, PROMPT, N_PREDICT, with_plugin=True)
    assert stock.strip(), "llama-completion without the plugin generated no text"
    assert spark == stock, res.explain(
        f"llama-completion: plugin text {spark!r} != upstream graph's {stock!r}")
    return {False: stock, True: spark}


# ---------------------------------------------------------------------------------------------
# 1. llama-server


def serve(model: Path, workdir: Path, with_plugin: bool) -> tuple[dict, int, str, uh.Server]:
    """A one-slot llama-server (SPARK_STATS=1): /completion and /v1/completions of PROMPT, then
    SIGINT. Returns ({endpoint: text}, exit status, log, server)."""
    srv = uh.Server(model, workdir, with_plugin=with_plugin, stats=True, n_parallel=1, ctx=512)
    try:
        native = srv.post("/completion", {"prompt": PROMPT, "n_predict": N_PREDICT, **GREEDY})
        oai = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": N_PREDICT, **GREEDY})
        texts = {"/completion": native["content"], "/v1/completions": oai["choices"][0]["text"]}
        rc, log = srv.stop()
    finally:
        srv.kill()
    return texts, rc, log, srv


def test_llama_server_completion_equals_upstreams_and_prints_the_table(model, local_text,
                                                                      tmp_path_factory):
    """The tiny model has no chat template, so the raw-prompt endpoints: /completion and
    /v1/completions, greedy, 24 tokens, on a server with the plugin and one without; the texts
    equal each other and llama-completion's. SIGINT: exit status 0, the plugin's table (rows
    0..9 only) ends the server's log; the stock server prints none."""
    workdir = tmp_path_factory.mktemp("doors-server")
    stock, stock_rc, stock_log, stock_srv = serve(model, workdir, with_plugin=False)
    spark, rc, log, srv = serve(model, workdir, with_plugin=True)
    print(f"\nllama-server: plugin {spark}\n  stock {stock}")
    assert stock_rc == 0, stock_srv.explain(f"stock server: exit status {stock_rc} after SIGINT")
    assert rc == 0, srv.explain(f"plugin server: exit status {rc} after SIGINT")
    assert stock["/completion"].strip(), stock_srv.explain("stock server: /completion is empty")
    for endpoint, text in spark.items():
        assert text == stock[endpoint], srv.explain(
            f"{endpoint}: plugin server {text!r} != stock server {stock[endpoint]!r}")
        assert text == local_text[True], srv.explain(
            f"{endpoint}: plugin server {text!r} != llama-completion {local_text[True]!r}")
    assert not uh.parse_stats(stock_log).lines, stock_srv.explain(
        "stock server (no plugin) printed spark-stats lines")
    assert_sparse_rows(log, srv.explain, "llama-server at SIGINT")
    lines = log.splitlines()
    first = next(i for i, line in enumerate(lines) if "spark-stats:" in line)
    assert all("spark-stats:" in line for line in lines[first:]), srv.explain(
        "the spark-stats table is not the end of the server's log")


def printable(text: str) -> str:
    """Letters and digits only: what any rendering of a reply keeps (the page renders Markdown
    and drops the control characters of the random model's text)."""
    return re.sub(r"[^A-Za-z0-9]", "", text)


def test_llama_servers_page_in_chromium(model, tmp_path_factory):
    """llama-server's web page in a real browser (tests/python/upstream/test_browser.py's
    chat_in_page: headless Chromium, type a message, Enter, read the reply), the server with the
    plugin: the reply shown is the server's greedy /v1/chat/completions reply (letters and
    digits compared), and the plugin's table at SIGINT has rows 0..9 only. The tiny model has no
    chat template: --chat-template chatml."""
    page = load_upstream_test("test_browser")
    srv = uh.Server(model, tmp_path_factory.mktemp("doors-page"), "--chat-template", "chatml",
                    "--temp", "0", "-n", str(N_PREDICT), "--seed", "1", with_plugin=True,
                    stats=True, webui=True)
    try:
        shot = uh.OUT_DIR / "gemma3n-browser-chat.png"
        uh.OUT_DIR.mkdir(parents=True, exist_ok=True)
        shown, steps = page.chat_in_page(srv, page.MESSAGE, shot)
        want = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": page.MESSAGE}], "max_tokens": N_PREDICT,
            **GREEDY})["choices"][0]["message"]["content"]
        assert printable(want), srv.explain(f"/v1/chat/completions gave no letters: {want!r}")
        assert printable(shown) == printable(want), srv.explain(
            f"the page shows {shown!r}, /v1/chat/completions gives {want!r}")
        rc, log = srv.stop()
    finally:
        srv.kill()
    assert rc == 0, srv.explain(f"exit status {rc} after SIGINT")
    assert_sparse_rows(log, srv.explain, "llama-server (web page) at SIGINT")
    print("\n" + "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1)) + f"\nreply shown: {shown!r}")


# ---------------------------------------------------------------------------------------------
# 2. llama-cli


CLI_DROP = re.compile(r"^\s*(\[ Prompt:|llama_perf|common_perf|Exiting|> )")


def cli_reply(stdout: str) -> str:
    """llama-cli's stdout less its timing lines ("[ Prompt: ... t/s ]"), which differ run to
    run; the banner, the echoed prompt and the reply stay."""
    return "\n".join(line for line in stdout.splitlines() if not CLI_DROP.match(line)).strip()


def test_llama_cli(tiny):
    """llama-cli as a person runs it once from a shell: a one-turn chat (`-st -p PROMPT`, stdin
    closed; the tiny model has no chat template, so `--chat-template chatml`), greedy. The same
    reply with and without the plugin, the plugin's table with rows 0..9 only."""
    def cli(with_plugin):
        return uh.run([uh.tool("llama-cli"), "-m", tiny["f32"], "--chat-template", "chatml", "-st",
                       "-p", PROMPT, "-n", "24", "--temp", "0", "--seed", uh.SEED, "-t", uh.THREADS,
                       "--simple-io", "--no-warmup"],
                      env=uh.tool_env(with_plugin), timeout=120)
    stock, spark = cli(False), cli(True)
    assert cli_reply(stock.stdout), stock.explain("llama-cli printed no reply")
    assert cli_reply(spark.stdout) == cli_reply(stock.stdout), spark.explain(
        f"llama-cli with the plugin printed\n{cli_reply(spark.stdout)}\nwithout it\n"
        f"{cli_reply(stock.stdout)}")
    assert not uh.parse_stats(stock.stderr).lines, stock.explain("spark-stats without the plugin")
    assert_sparse_rows(spark.stderr, spark.explain, "llama-cli")


# ---------------------------------------------------------------------------------------------
# 3. llama-bench


def test_llama_bench_runs_with_the_plugin(model):
    """llama-bench -p 32 -n 8 -r 1 with the plugin: exit 0, a JSON record for pp32 and one for
    tg8 of this gemma3n model on the "Spark" backend list with a positive rate, and the plugin's
    table (rows 0..9 only) at exit."""
    res = uh.run([uh.tool("llama-bench"), "-m", model, "-p", "32", "-n", "8", "-r", "1",
                  "-t", uh.THREADS, "-o", "json"], env=uh.tool_env(True), timeout=120)
    try:
        records = json.loads(res.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(res.explain(f"llama-bench -o json: not JSON ({e}):\n{res.stdout}"),
                    pytrace=False)
    tests = {(r["n_prompt"], r["n_gen"]): r for r in records}
    assert set(tests) == {(32, 0), (0, 8)}, res.explain(
        f"llama-bench records (n_prompt, n_gen) {sorted(tests)}, want pp32 and tg8: {records}")
    for r in records:
        assert "gemma3n" in r["model_type"], res.explain(f"model_type of {r}, want gemma3n")
        assert r["avg_ts"] > 0, res.explain(f"avg_ts of {r}, want > 0")
        assert r["backends"] == "Spark", res.explain(f"backends of {r}, want 'Spark'")
    assert_sparse_rows(res.stderr, res.explain, "llama-bench")
    print(f"\nllama-bench: pp32 {tests[(32, 0)]['avg_ts']:.1f} t/s, tg8 "
          f"{tests[(0, 8)]['avg_ts']:.1f} t/s ({tests[(32, 0)]['model_type']})")


# ---------------------------------------------------------------------------------------------
# 4. llama-cpp-python


def test_llama_cpp_python_greedy_text_equals_upstreams(model, local_text):
    """As test_python.py runs the shipped model: `Llama(model_path, n_ctx=256, ...)` and a greedy
    create_completion in a Python process of its own, with GGML_BACKEND_PATH set before the
    import, and in one without; the same text (and llama-completion's, printed), and the
    plugin's table (rows 0..9 only) at the plugin process's exit."""
    py = load_upstream_test("test_python")
    runs = {}
    for with_plugin in (False, True):
        out, res = py.run_llama(model, [py.greedy(PROMPT, N_PREDICT)], with_plugin=with_plugin)
        assert "error" not in out, res.explain(f"llama-cpp-python (plugin {with_plugin}): {out}")
        runs[with_plugin] = (out["calls"][0]["choices"][0]["text"], res)
    (stock, stock_res), (spark, res) = runs[False], runs[True]
    print(f"\nllama-cpp-python: plugin {spark!r}\n  stock {stock!r}\n"
          f"  llama-completion {local_text[True]!r}")
    assert stock.strip(), stock_res.explain("llama-cpp-python without the plugin: no text")
    assert spark == stock, res.explain(
        f"llama-cpp-python: plugin text {spark!r} != without the plugin {stock!r}")
    assert not uh.parse_stats(stock_res.stderr).lines, stock_res.explain(
        "llama-cpp-python without the plugin printed spark-stats lines")
    assert_sparse_rows(res.stderr, res.explain, "llama-cpp-python process")


# ---------------------------------------------------------------------------------------------
# 5. ggml RPC


def rpc_client_completion(model, server, ngl: str):
    """llama-completion with the plugin, `--rpc` to `server` with `-ngl ngl` (at -lv 4): its
    greedy text and run; fails the test with both logs when the client fails or the server dies."""
    text, res = uh.llama_completion(model, PROMPT, N_PREDICT, True, "--rpc", server.endpoint,
                                    "-ngl", ngl, "-lv", "4", check=False)
    alive = server.proc.poll() is None
    if res.returncode != 0 or not alive:
        pytest.fail(res.explain(
            f"llama-completion --rpc {server.endpoint} -ngl {ngl} failed (exit status "
            f"{uh.exit_status(res.returncode)}; server "
            f"{'running' if alive else 'exited ' + uh.exit_status(server.proc.returncode)})\n"
            + server.explain("the server")), pytrace=False)
    return text, res


def test_rpc_server_with_the_plugin_runs_the_sparse_layers(model, local_text, tmp_path):
    """rpc-server with the plugin (test_rpc.py's start_rpc_server), llama-completion with the
    plugin, `--rpc HOST:PORT -ngl 99`: every layer on the server, the local greedy text, the
    server's table (printed at SIGTERM) has rows 0..9 only (spark_ffn_up ran there, next to its
    weights: the named op travelled, patch 0009), and the client ran no Spark kernel."""
    rpc = load_upstream_test("test_rpc")
    server = rpc.start_rpc_server(tmp_path, with_plugin=True)
    try:
        text, res = rpc_client_completion(model, server, "99")
    finally:
        server_log = server.stop()
    assert re.search(rf"RPC\d+\[{re.escape(server.endpoint)}\] model buffer size", res.stderr), \
        res.explain(f"no model buffer on the RPC device {server.endpoint}")
    done, total = rpc.offloaded(res)
    assert done == total, res.explain(f"offloaded {done}/{total} layers to the RPC server")
    print(f"\nrpc: {text!r} ({res.seconds:.2f} s)\nserver's spark-stats:\n"
          + "\n".join(uh.parse_stats(server_log).lines))
    assert text == local_text[True], res.explain(
        f"--rpc -ngl 99 text {text!r} != local llama-completion's {local_text[True]!r}")
    client = uh.parse_stats(res.stderr)
    assert not client.rows, res.explain(
        f"the client ran Spark kernels for layers {sorted(client.rows)} although every layer is "
        f"on the RPC server")
    assert_sparse_rows(server_log, server.explain, "rpc-server at SIGTERM")


def test_layers_on_a_device_without_the_spark_ops_keep_upstreams_graph(model, local_text, tmp_path):
    """An rpc-server without the plugin stands for any device that cannot run the Spark ops
    (Vulkan, Metal, SYCL, a CUDA build without the launchers): llama-completion with the plugin
    puts the last layers there (`-ngl` so that sparse layers 5..9 are on the server and 0..4 on
    the CPU). Those five keep upstream's graph on the server, said in one load line, instead of
    running the Spark ops on the client with their weights copied back at every evaluation: the
    client's table has rows 0..4 only, the text is the local one."""
    rpc = load_upstream_test("test_rpc")
    server = rpc.start_rpc_server(tmp_path, with_plugin=False)
    try:
        # -ngl N puts layers n_layer + 1 - N .. on the device (the output layer counts as one)
        _, probe = uh.llama_completion(model, PROMPT, 1, True, "-lv", "4")
        n_layer = int(re.search(r"n_layer\s*=\s*(\d+)", probe.stderr).group(1))
        on_cpu = 5
        text, res = rpc_client_completion(model, server, str(n_layer + 1 - on_cpu))
    finally:
        server.stop()
    said = re.findall(r"Spark: sparse FFN layers (\d+)-(\d+) are on (\S+), which does not run "
                      r"the Spark ops: they keep upstream's graph there", res.stderr)
    assert said == [(str(on_cpu), str(N_LAYER_SPARSE - 1), f"RPC0[{server.endpoint}]")], \
        res.explain(f"the load line for layers {on_cpu}..{N_LAYER_SPARSE - 1}: got {said}")
    print(f"\nrpc, layers {on_cpu}.. on a server without the plugin: {text!r} ({res.seconds:.2f} s)")
    assert text == local_text[True], res.explain(
        f"text {text!r} != local llama-completion's {local_text[True]!r}")
    client = uh.parse_stats(res.stderr)
    assert sorted(client.rows) == list(range(on_cpu)), res.explain(
        f"the client ran Spark kernels for layers {sorted(client.rows)}, want 0..{on_cpu - 1}: "
        f"the layers on the server must keep upstream's graph there")


# ---------------------------------------------------------------------------------------------
# 6. damaged files


def damaged_copy(src: Path, dst: Path, case: str) -> str:
    """Writes a damaged copy of `src` and returns the regular expression of llama.cpp's load
    error for it."""
    import gguf
    import numpy as np
    data = src.read_bytes()
    if case == "truncated":
        dst.write_bytes(data[: len(data) // 2])
        return r"tensor '[^']+' data is not within the file bounds"
    dst.write_bytes(data)
    reader = gguf.GGUFReader(dst, "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.3.ffn_up.weight")
    parts = tensor.field.parts  # name length, name, n_dims, dims, type, offset
    if case == "wrong-shape":  # [n_embd, n_ff] -> [n_ff, n_embd]: the same bytes
        parts[3][...] = parts[3][::-1].copy()
        pattern = r"tensor 'blk\.3\.ffn_up\.weight' has wrong shape"
    else:  # "missing": renamed, same length
        parts[1][...] = np.frombuffer(b"blk.3.ffn_uq.weight", dtype=np.uint8)
        pattern = r"tensor 'blk\.3\.ffn_up\.weight' not found"
    reader.data.flush()
    del reader
    return pattern


def failed_load(path: Path, pattern: str, with_plugin: bool) -> uh.Result:
    """llama-completion on a file it cannot load. An early exit can outrun the tools' log thread
    (uh.FAILED_LOAD_RUNS): a failing run without `pattern` in stderr is made again for it."""
    args = [uh.tool("llama-completion"), "-m", path, "-p", PROMPT, "-n", "4", "--temp", "0",
            "-t", uh.THREADS, "-no-cnv", "--no-warmup"]
    for _ in range(uh.FAILED_LOAD_RUNS):
        res = uh.run(args, env=uh.tool_env(with_plugin), timeout=60, check=False)
        if res.returncode <= 0 or re.search(pattern, res.stderr):
            break
    return res


def load_error(res: uh.Result) -> str | None:
    """llama.cpp's reason in `llama_model_load: error loading model: REASON`."""
    m = re.search(r"error loading model: (.*)", res.stderr)
    return m.group(1).strip() if m else None


@pytest.mark.parametrize("case", ["truncated", "wrong-shape", "missing"])
def test_damaged_file_is_a_named_load_error(model, tmp_path, case):
    """llama-completion with the plugin on a damaged copy of the tiny model (cut to half its
    size; blk.3.ffn_up.weight, the up matrix of a sparse layer that the patch loads as row
    gathers for spark_ffn_up, with its dimensions swapped or under another name): exit status
    > 0 (not a signal) and llama.cpp's own load error naming the problem in stderr, the same
    error as without the plugin."""
    path = tmp_path / f"gemma3n-{case}.gguf"
    pattern = damaged_copy(model, path, case)
    res = failed_load(path, pattern, with_plugin=True)
    print(f"\n{case}: exit {uh.exit_status(res.returncode)}: {load_error(res)}")
    assert res.returncode > 0, res.explain(
        f"{case}: exit status {uh.exit_status(res.returncode)}, want a failure > 0 (no signal)")
    assert re.search(pattern, res.stderr), res.explain(
        f"{case}: stderr lacks llama.cpp's load error /{pattern}/")
    stock = failed_load(path, pattern, with_plugin=False)
    assert stock.returncode == res.returncode and load_error(stock) == load_error(res), \
        res.explain(f"{case}: with the plugin exit {res.returncode}, {load_error(res)!r}; "
                    f"without: exit {stock.returncode}, {load_error(stock)!r}")
