"""Helpers of the upstream-tool tests (tests/python/upstream): llama.cpp's own tools
(llama-completion, llama-server, llama-perplexity, llama-quantize, llama-bench,
ggml-rpc-server), built with the Spark patch series by `bash tools/upstream.sh` into
target/upstream/, running Spark models with the Spark kernels loaded as a ggml backend plugin
(GGML_BACKEND_PATH=target/upstream/lib/libggml-spark.so) or without them (the dense stock-op
graph).

Conventions: every tool runs with 2 threads, on loopback only, with a time limit; a failure
names the command (with its environment variables) and ends with the tool's stderr tail. The
tools missing is a failure that says how to build them, not a skip."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = Path(os.environ.get("SPARK_UPSTREAM_DIR", ROOT / "target" / "upstream"))
UPSTREAM_BIN = UPSTREAM / "bin"
PLUGIN = UPSTREAM / "lib" / "libggml-spark.so"
SPARK_BIN = Path(os.environ.get("SPARK_BIN_DIR", ROOT / "target" / "debug"))
OUT_DIR = ROOT / "tests" / "out"  # artifacts (git-ignored)

MODEL_NPZ = ROOT / "models" / "spark-shakespeare.npz"
EVAL = json.loads((ROOT / "models" / "spark-shakespeare.eval.json").read_text())
HELDOUT = ROOT / "models" / "heldout.txt"
CFG = EVAL["config"]
TARGET_KEEP = CFG["ffn_k"] / CFG["d_ff"]  # k_f / F of the shipped model (82 / 1024)

THREADS = "2"


def sibling_module(name: str, path: str):
    """A module of this directory by file, registered as `name` (pytest imports with
    importlib: there is no sys.path entry for the test directories)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


SEED = "1"

# Gemma-2's chat template (the tokenizer_config.json of google/gemma-2-2b-it), which a Spark
# model, a Gemma-2, carries as tokenizer.chat_template (`spark-convert --chat-template @FILE`).
# The shipped model's vocabulary has no <start_of_turn> token: the markers are plain text to it.
GEMMA2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")


def gemma2_prompt(user: str) -> str:
    """What GEMMA2_CHAT_TEMPLATE renders for one user message and the generation prompt, less
    the leading BOS (which the tokenizer adds)."""
    return f"<start_of_turn>user\n{user.strip()}<end_of_turn>\n<start_of_turn>model\n"
STDERR_TAIL_LINES = 60


# ---------------------------------------------------------------------------------------------
# binaries and processes


def tool(name: str) -> Path:
    """An installed upstream tool; fails (does not skip) when tools/upstream.sh has not run."""
    path = UPSTREAM_BIN / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: build llama.cpp's tools and the Spark plugin first with "
                    f"`bash tools/upstream.sh` (or set SPARK_UPSTREAM_DIR)", pytrace=False)
    return path


def plugin() -> Path:
    if not PLUGIN.is_file():
        pytest.fail(f"{PLUGIN} is missing: build it with `bash tools/upstream.sh`", pytrace=False)
    return PLUGIN


def spark_binary(name: str) -> Path:
    path = SPARK_BIN / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it first (cargo build) or set SPARK_BIN_DIR",
                    pytrace=False)
    return path


PKG_VERSION = "0.3.36"  # tools/python.sh's pin of llama-cpp-python


def python_env(with_plugin: bool = True, stats: bool = True) -> dict:
    """Ours, without anything that would point llama_cpp elsewhere than its installed binding."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GGML_BACKEND_PATH", "SPARK_STATS", "LLAMA_CPP_LIB_PATH", "MTMD_CPP_LIB")}
    if with_plugin:
        env["GGML_BACKEND_PATH"] = str(plugin())
    if stats:
        env["SPARK_STATS"] = "1"
    return env


def llama_cpp_installed():
    """Fails (does not skip) when tools/python.sh has not installed the binding."""
    res = run([sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
              env=python_env(False, False), check=False)
    if res.returncode != 0 or res.stdout.strip() != PKG_VERSION:
        pytest.fail(res.explain(f"llama-cpp-python {PKG_VERSION} is not importable from "
                                f"{sys.executable}: install it with `bash tools/python.sh`"),
                    pytrace=False)


def tool_env(with_plugin: bool, stats: bool = True) -> dict:
    """The environment of a tool: ours without llama.cpp's LLAMA_ARG_* defaults and without
    GGML_BACKEND_PATH / SPARK_STATS, then those two as asked (SPARK_STATS=1 is also set without
    the plugin: the tool itself must not print the table then)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LLAMA_ARG_") and k not in ("GGML_BACKEND_PATH", "SPARK_STATS")}
    if with_plugin:
        env["GGML_BACKEND_PATH"] = str(plugin())
    if stats:
        env["SPARK_STATS"] = "1"
    return env


def tail(text: str, n: int = STDERR_TAIL_LINES) -> str:
    lines = (text or "").splitlines()
    return "\n".join(lines[-n:])


def describe(args, env: dict | None) -> str:
    """The command line as a shell would take it, with the variables that matter."""
    prefix = ""
    if env is not None:
        prefix = "".join(f"{k}={shlex.quote(env[k])} " for k in ("GGML_BACKEND_PATH", "SPARK_STATS")
                         if k in env)
    return prefix + " ".join(shlex.quote(str(a)) for a in args)


def exit_status(rc: int | None) -> str:
    """An exit status as subprocess reports it, with the signal's name for a negative one."""
    if rc is not None and rc < 0:
        try:
            return f"{rc} ({signal.Signals(-rc).name})"
        except ValueError:
            pass
    return str(rc)


@dataclass
class Result:
    args: list
    env: dict | None
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def command(self) -> str:
        return describe(self.args, self.env)

    def explain(self, what: str = "") -> str:
        return (f"{what}\ncommand: {self.command}\nexit status: {exit_status(self.returncode)}\n"
                f"--- stderr (last {STDERR_TAIL_LINES} lines) ---\n{tail(self.stderr)}")


def run(args, env: dict | None = None, timeout: float = 180, check: bool = True) -> Result:
    """Runs a command to completion (stdin closed); check: fail unless it exits 0."""
    args = [str(a) for a in args]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"timed out after {timeout} s\ncommand: {describe(args, env)}\n"
                    f"--- stderr (last {STDERR_TAIL_LINES} lines) ---\n{tail(err)}", pytrace=False)
    res = Result(args, env, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
    if check and proc.returncode != 0:
        pytest.fail(res.explain("the command failed"), pytrace=False)
    return res


# Upstream tools print through common/log.cpp's worker thread, whose logger is leaked at exit
# without a flush (upstream says so in `common_log_main`: "logs may be lost if not flushed before
# the program exits"). On a loaded machine the end of a capture was seen missing from
# llama-completion's stdout and llama-perplexity's results, with exit status 0.
LOST_CAPTURE_RUNS = 3
# A load that fails exits within ~10 ms, often before the log thread has printed the reason:
# stock llama-completion on a truncated file lost it in 64 runs of 100 here with both cores busy
# (as in CI). So a failed load is made up to this many times (< 1 s; 0.64^30 ~ 1e-6 lost).
FAILED_LOAD_RUNS = 30


def run_until_complete(args, complete: Callable[[Result], bool], env: dict | None = None,
                       timeout: float = 180, check: bool = True,
                       runs: int = LOST_CAPTURE_RUNS) -> Result:
    """`run`, again (`runs` runs in all) while a run that exited 0 lacks what every complete run
    of the tool prints last (`complete(res)` is false): such a run is a lost capture, not a
    result. The last run is returned either way, for the caller's assertions."""
    for _ in range(runs):
        res = run(args, env=env, timeout=timeout, check=check)
        if res.returncode != 0 or complete(res):
            break
    return res


def spark_cli(*args, timeout: float = 180) -> Result:
    """The project's own CLI (target/debug/spark)."""
    return run([spark_binary("spark"), *args], env=tool_env(False, stats=False), timeout=timeout)


# ---------------------------------------------------------------------------------------------
# the plugin's SPARK_STATS=1 report


@dataclass
class StatsRow:
    keep: float
    tokens: int
    attn_positions: float
    attn_queries: int


@dataclass
class Stats:
    lines: list = field(default_factory=list)  # every line starting "spark-stats:"
    header: bool = False
    none_ran: bool = False  # "spark-stats: no Spark kernel ran in this process ..."
    cpu_kernels: str = ""  # "spark-stats: cpu kernels avx2": the instruction set of the CPU kernels
    rows: dict = field(default_factory=dict)  # layer -> StatsRow


def parse_stats(stderr: str) -> Stats:
    s = Stats()
    for line in stderr.splitlines():
        # the report is printed at exit, possibly after an unfinished progress line of the tool
        # (llama-perplexity's "ETA "), so it may start mid-line
        at = line.find("spark-stats:")
        if at < 0:
            continue
        line = line[at:]
        s.lines.append(line)
        f = line.split()
        if f[1:3] == ["layer", "ffn_keep_rate"]:
            s.header = True
        elif "no Spark kernel ran" in line:
            s.none_ran = True
        elif f[1:3] == ["cpu", "kernels"] and len(f) == 4:
            s.cpu_kernels = f[3]
        elif len(f) == 6 and f[1].isdigit():
            s.rows[int(f[1])] = StatsRow(float(f[2]), int(f[3]), float(f[4]), int(f[5]))
    return s


def assert_stats_table(stderr: str, n_layers: int, keep: float, tol: float = 0.015,
                       explain=lambda what: what, n_heads: int = CFG["n_heads"]) -> Stats:
    """The plugin's table is in `stderr` with one row per layer, every layer ran its sparse FFN
    on some tokens with a keep rate within tol of `keep`, and its sparse attention kernel on
    every query: attn_queries = n_heads x the tokens of layer 0 (the last layer's FFN runs on the
    output rows only, its attention on every token). explain(what) makes the failure message
    (e.g. Result.explain: the command and its stderr tail)."""
    s = parse_stats(stderr)
    assert s.header and not s.none_ran, explain(
        f"no spark-stats table in stderr (SPARK_STATS=1 with the plugin; got {s.lines}): did the "
        f"Spark kernels run?")
    assert sorted(s.rows) == list(range(n_layers)), explain(
        f"spark-stats rows for layers {sorted(s.rows)}, want 0..{n_layers - 1}")
    tokens = s.rows[0].tokens
    for layer, row in s.rows.items():
        assert row.tokens > 0, explain(f"layer {layer}: ffn_tokens = 0")
        assert abs(row.keep - keep) <= tol, explain(
            f"layer {layer}: ffn_keep_rate {row.keep} is not within {tol} of {keep:.4f}")
    short = {layer: row.attn_queries for layer, row in s.rows.items()
             if row.attn_queries != n_heads * tokens}
    assert not short, explain(
        f"the sparse attention kernel ran for {short} (layer: (query, head) pairs), but "
        f"{n_heads} heads x {tokens} tokens = {n_heads * tokens} went through each layer: the "
        f"rest ran on the dense stock-op attention. (The spark-gemma2 graph, patch 0002, uses "
        f"spark_attn only when the KV cache view has one stream: 'the sparse kernel takes one "
        f"stream'; a ubatch holding several sequences of a non-unified KV cache has several.)")
    return s


# ---------------------------------------------------------------------------------------------
# llama-completion


# What llama-completion prints last, at exit, after a complete run.
COMPLETION_END = "\n\n"


def completion_text(stdout: str) -> str:
    """The generated text of `llama-completion --no-display-prompt`: its stdout less what it
    appends, " [end of text]\\n" when the model ended the text and COMPLETION_END at exit."""
    text = stdout
    if text.endswith(COMPLETION_END):
        text = text[: -len(COMPLETION_END)]
    if text.endswith(" [end of text]\n"):
        text = text[: -len(" [end of text]\n")]
    return text


def llama_completion(model: Path, prompt: str, n: int, with_plugin: bool, *extra,
                     stats: bool = True, timeout: float = 180, check: bool = True,
                     once: bool = False, env: dict | None = None,
                     wrap: tuple = ()) -> tuple[str, Result]:
    """Greedy completion (temperature 0, fixed seed, 2 threads, no chat mode, no warm-up run;
    `env`: variables added to the tool's; `wrap`: a command that runs the tool, such as
    `prlimit --memlock=N`).
    Every complete run ends its stdout with COMPLETION_END; a capture without it (the last
    token was seen missing with it) is run again (`run_until_complete`), unless `once`: a caller
    that measures the run itself (bytes over a connection) needs exactly one, whatever its
    capture."""
    cmd = [*wrap, tool("llama-completion"), "-m", model, "-p", prompt, "-n", n, "--temp", "0",
           "--seed", SEED, "-t", THREADS, "-no-cnv", "--no-display-prompt", "--no-warmup", *extra]
    res = run_until_complete(cmd, lambda r: r.stdout.endswith(COMPLETION_END),
                             env={**tool_env(with_plugin, stats), **(env or {})}, timeout=timeout,
                             check=check, runs=1 if once else LOST_CAPTURE_RUNS)
    return completion_text(res.stdout), res


def assert_k_dial(res: Result, text: str, full_stderr: str, model: Path, prompt: str, n: int,
                  small_k: int) -> None:
    """A run at k_f = `small_k` through llama.cpp's key override (from any client): keep rates
    at small_k / F in every layer, each under 3/4 of the full-k run's (`full_stderr`), and the
    same text and per-layer statistics as `spark run --spark-ffn-k small_k` (the same neurons
    kept); prints both runs' rates."""
    small_keep = small_k / CFG["d_ff"]
    small = assert_stats_table(res.stderr, CFG["n_layers"], small_keep, tol=0.01,
                               explain=res.explain)
    full = parse_stats(full_stderr)
    for layer, row in small.rows.items():
        assert row.keep < full.rows[layer].keep * 0.75, res.explain(
            f"layer {layer}: keep rate {row.keep} with k={small_k}, "
            f"{full.rows[layer].keep} with k={CFG['ffn_k']}")
    want, spark_res = spark_run_text(model, prompt, n, "--spark-stats", "--spark-ffn-k",
                                     str(small_k))
    assert text == want, (text, want)
    assert small.rows == parse_stats(spark_res.stderr).rows, (small.rows, spark_res.stderr)
    print(f"\nk_f={small_k}: " + " ".join(f"{r.keep:.4f}" for r in small.rows.values())
          + f" (target {small_keep:.4f})\nk_f={CFG['ffn_k']}: "
          + " ".join(f"{r.keep:.4f}" for r in full.rows.values()) + f" (target {TARGET_KEEP:.4f})")


def spark_run_text(model: Path, prompt: str, n: int, *extra) -> tuple[str, Result]:
    """`spark run` greedy text: its stdout is the prompt, the generated text and one newline."""
    res = spark_cli("run", "-m", model, "-p", prompt, "-n", n, "--temp", "0", "--seed", SEED,
                    "-t", THREADS, *extra)
    out = res.stdout
    assert out.startswith(prompt) and out.endswith("\n"), res.explain(f"unexpected stdout {out!r}")
    return out[len(prompt):-1], res


# ---------------------------------------------------------------------------------------------
# llama-server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama-server on 127.0.0.1 at a free port; its stderr goes to a file. Use stop() (or the
    fixture finalizer) to end it."""

    def __init__(self, model: Path, workdir: Path, *extra, with_plugin: bool, stats: bool = False,
                 n_parallel: int = 4, ctx: int = 1024, ready_timeout: float = 90,
                 webui: bool = False):
        self.port = free_port()
        self.env = tool_env(with_plugin, stats)
        self.args = [str(a) for a in (
            tool("llama-server"), "-m", model, "--host", "127.0.0.1", "--port", self.port,
            "-np", n_parallel, "-c", ctx, "-t", THREADS, "-tb", THREADS,
            *([] if webui else ["--no-webui"]), *extra)]
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"llama-server-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self.returncode = None
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.kill()
            raise

    @property
    def command(self) -> str:
        return describe(self.args, self.env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def explain(self, what: str) -> str:
        return (f"{what}\nserver: {self.command}\n--- server log (last {STDERR_TAIL_LINES} lines) "
                f"---\n{tail(self.log())}")

    def _wait_ready(self, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(self.explain(f"llama-server exited ({self.proc.returncode}) while "
                                         f"loading"), pytrace=False)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                resp = conn.getresponse()
                resp.read()
                conn.close()
                if resp.status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        pytest.fail(self.explain(f"llama-server not ready after {timeout} s"), pytrace=False)

    def post(self, path: str, body: dict, timeout: float = 120) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read().decode(errors="replace")
        except OSError as e:
            pytest.fail(self.explain(f"POST {path} {json.dumps(body)}: {e!r}"), pytrace=False)
        finally:
            conn.close()
        if resp.status != 200:
            pytest.fail(self.explain(f"POST {path} {json.dumps(body)}: HTTP {resp.status}: {data}"),
                        pytrace=False)
        return json.loads(data)

    def stream(self, path: str, body: dict, timeout: float = 120) -> list:
        """POST with "stream": true; the JSON objects of the server-sent events, in order (the
        terminating "data: [DONE]" of the OpenAI endpoints is checked and left out)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        events, done = [], False
        try:
            conn.request("POST", path, json.dumps({**body, "stream": True}),
                         {"Content-Type": "application/json", "Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status != 200:
                pytest.fail(self.explain(f"POST {path} (stream): HTTP {resp.status}: "
                                         f"{resp.read().decode(errors='replace')}"), pytrace=False)
            ctype = resp.getheader("Content-Type", "")
            assert ctype.startswith("text/event-stream"), ctype
            for raw in resp:
                line = raw.decode().rstrip("\r\n")
                if not line.startswith("data:"):
                    continue  # blank separators, comments, event: lines
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    done = True
                    break
                assert not done
                events.append(json.loads(data))
        except OSError as e:
            pytest.fail(self.explain(f"POST {path} (stream) {json.dumps(body)}: {e!r}"),
                        pytrace=False)
        finally:
            conn.close()
        if path.startswith("/v1/"):
            assert done, f"{path}: the event stream did not end with data: [DONE]"
        return events

    def stop(self, sig=signal.SIGINT, timeout: float = 30) -> tuple[int, str]:
        """Ends the server with `sig` (graceful shutdown); kills it after `timeout` s. Returns
        its exit status and log."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(self.explain(f"llama-server did not exit within {timeout} s of "
                                         f"{signal.Signals(sig).name}; killed"), pytrace=False)
        self.returncode = self.proc.returncode
        self._log.close()
        return self.returncode, self.log_path.read_text(errors="replace")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self._log.closed:
            self._log.close()


# ---------------------------------------------------------------------------------------------
# llama-quantize


def llama_quantize(src: Path, dst: Path, qtype: str) -> Result:
    res = run([tool("llama-quantize"), src, dst, qtype, THREADS], env=tool_env(False, stats=False))
    assert dst.is_file() and dst.stat().st_size > 0, res.explain(f"{dst} was not written")
    return res

# ---------------------------------------------------------------------------------------------
# llama-perplexity


def final_ppl(res) -> str:
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", res.stdout + res.stderr)
    assert m, res.explain("no 'Final estimate: PPL = X' in the output")
    return m.group(1)


# What a complete llama-perplexity run prints last: the final estimate (perplexity and
# --kl-divergence-base modes, on stderr), or the "Same top p" line (--kl-divergence, on stdout).
PERPLEXITY_END = re.compile(r"Final estimate: PPL = [0-9.]+ \+/- [0-9.]+\n|"
                            r"Same top p: *[0-9.]+ ± *[0-9.]+ %\n")


def llama_perplexity(model, *extra, with_plugin=True, env: dict | None = None):
    """One llama-perplexity run (`env`: variables added to the tool's); a capture that lost its
    end (`run_until_complete`) is run again."""
    return run_until_complete([tool("llama-perplexity"), "-m", model, "-t", THREADS, *extra],
                              lambda r: PERPLEXITY_END.search(r.stdout + r.stderr) is not None,
                              env={**tool_env(with_plugin), **(env or {})}, timeout=300)


def stat(res, name: str) -> float:
    """A figure llama-perplexity prints as `name : value`."""
    m = re.search(re.escape(name) + r"\s*:\s*(-?[0-9.]+)", res.stdout + res.stderr)
    assert m, res.explain(f"no '{name}' in the output")
    return float(m.group(1))


# ---------------------------------------------------------------------------------------------
# llama.cpp's extra CPU buffer types (AMX, CPU_REPACK) against plain buffers (-nr)

# "load_tensors:   CPU_REPACK model buffer size =     1.05 MiB" (-v; the memory-fit pass prints
# the same lines first with 0.00 MiB, the load after it with the real sizes)
MODEL_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB")
PLAIN_BUFFER_TYPES = {"CPU", "CPU_Mapped"}


def extra_buffer_types(stderr: str) -> dict[str, float]:
    """{buffer type: MiB} of the weights a -v run loaded into extra CPU buffer types."""
    sizes = {}
    for name, mib in MODEL_BUFFER.findall(stderr):
        sizes[name] = float(mib)  # the last line of each type: the real load's
    return {k: v for k, v in sizes.items() if k not in PLAIN_BUFFER_TYPES and v > 0}


def cpu_flags() -> str:
    """The instruction-set flags that decide which extra buffer types a CPU has."""
    try:
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines()
                     if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return "flags unknown"
    wanted = ("avx2", "avx512f", "avx512_vnni", "amx_int8", "amx_tile", "asimd", "i8mm", "sve")
    return " ".join(f for f in wanted if f in flags) or "none of avx2/avx512f/amx_int8"


def extra_buffers_vs_plain(model: Path, tmp: Path, ub: str, *args, with_plugin: bool = True):
    """llama-perplexity with the extra buffer types off (-nr: every weight in a plain buffer)
    writes the base log-probabilities; the default run (AMX, CPU_REPACK on) is scored against
    it with the same ubatch. Both compute the same quantized dot products; only where a weight
    sits, and so the kernel and its order of float sums, differs. Returns the scored run and
    {extra buffer type: MiB} of its load; the test is skipped, saying why, when no extra type
    took a weight (then both runs are the same computation)."""
    base = tmp / f"{model.stem}-nr-ub{ub}.kld"
    llama_perplexity(model, *args, "-ub", ub, "-nr", "--kl-divergence-base", base,
                     with_plugin=with_plugin)
    res = llama_perplexity(model, *args, "-ub", ub, "-v", "--kl-divergence-base", base,
                           "--kl-divergence", with_plugin=with_plugin)
    extra = extra_buffer_types(res.stderr)
    if not extra:
        pytest.skip(f"no extra CPU buffer type took a weight of {model.name} on this CPU "
                    f"({cpu_flags()}): the default run is -nr's computation")
    return res, extra


def assert_extra_buffers_agree(res, extra: dict, mean_kld: float, same_top: float, what: str):
    """The default run against -nr's: mean KLD and top-1 agreement within the bounds."""
    mean, top = stat(res, "Mean    KLD"), stat(res, "Same top p")
    where = ", ".join(f"{k} {v:.2f} MiB" for k, v in extra.items())
    print(f"\n{what}: extra buffers ({where}) vs -nr: mean KLD {mean:.2e}, same top {top} %")
    assert mean <= mean_kld and top >= same_top, res.explain(
        f"{what}: with the extra buffer types ({where}) the logits are not -nr's: mean KLD "
        f"{mean:.3g} (bound {mean_kld:g}), same top {top} % (bound {same_top} %); an error in "
        f"ggml's {'/'.join(extra)} kernels (docs/USAGE.md, 'Intel CPUs with AMX')")
