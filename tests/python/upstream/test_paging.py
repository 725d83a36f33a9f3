"""FFN rows read from storage (issue 55, spark-backend/src/rows/paging.rs) through llama.cpp's own
tools with the plugin: with `SPARK_PAGING=always` every layer's K2 and V rows are treated as not in
memory (advised MADV_RANDOM, each step's rows requested with MADV_WILLNEED before the kernels read
them), which is what a memory-mapped model larger than the memory left to it gets. Advice never
changes what the memory holds, so the logits must be bit for bit those of the model in memory;
the plugin says once that rows stream, and a model in memory says nothing.

The same under a real budget (the file's pages evicted, memory held away by
tools/memory-budget.py) is tools/bench-memory.sh's (docs/PERF.md, "Models larger than memory"):
too slow for CI; the kernel-level test on an evicted file is spark-backend/tests/paging.rs.

At load the model weighs its weights against the memory left (spark-backend/src/rows/budget.rs,
patch 0021): `SPARK_MEMORY` sets that memory here, and the sizes the tools print are checked
against the file as gguf-py reads it."""

from __future__ import annotations

import re
import resource
import shutil
import sys

import gguf
import pytest

from upstream_helpers import (CFG, HELDOUT, THREADS, llama_completion, llama_cpp_installed,
                              llama_perplexity, python_env, run, spark_binary, stat, tool,
                              tool_env)

STREAMING_LINE = "are not all in memory"
PPL_ARGS = ["-c", "256", "-b", "256", "--chunks", "3"]


def test_rows_requested_from_storage_give_the_logits_of_memory(shipped_f32, tmp_path):
    base = tmp_path / "in-memory.kld"
    res0 = llama_perplexity(shipped_f32, *PPL_ARGS, "-f", HELDOUT, "--kl-divergence-base", base)
    assert STREAMING_LINE not in res0.stderr, res0.explain("a model in memory said its rows stream")
    res = llama_perplexity(shipped_f32, *PPL_ARGS, "--kl-divergence-base", base, "--kl-divergence",
                           env={"SPARK_PAGING": "always"})
    lines = [line for line in res.stderr.splitlines() if STREAMING_LINE in line]
    assert len(lines) == 1, res.explain(f"not one line that rows stream: {lines}")
    assert "layer 0" in lines[0] and "K2 and V rows are requested" in lines[0], lines[0]
    print(f"\n{lines[0]}\nmean KLD {stat(res, 'Mean    KLD')}, same top {stat(res, 'Same top p')} %")
    assert stat(res, "Mean    KLD") == 0.0, res.stdout
    assert stat(res, "Same top p") == 100.0, res.stdout


def test_greedy_text_is_the_same_in_every_mode_and_a_bad_value_is_named(shipped_f32):
    want, _ = llama_completion(shipped_f32, "ROMEO:", 24, True)
    for mode in ["always", "never", "sometimes"]:
        text, res = llama_completion(shipped_f32, "ROMEO:", 24, True, env={"SPARK_PAGING": mode})
        assert text == want, res.explain(f"SPARK_PAGING={mode}: {text!r} vs {want!r}")
        assert (STREAMING_LINE in res.stderr) == (mode == "always"), res.explain(f"SPARK_PAGING={mode}")
    assert "SPARK_PAGING: 'sometimes' is not auto, always or never; auto applies" in res.stderr, \
        res.explain("the bad value was not named")


MARGIN = 64 << 20  # rows::paging::FILL_MARGIN
LOAD_LINE = "do not all fit in the memory left"
NOT_PINNED = "of weights every token reads whole could not be pinned in memory"
ROW_TENSORS = (".ffn_up.weight", ".ffn_down_t.weight", ".ffn_k2v.weight")
# llama.cpp's loader, for each tensor it reads on demand (--lazy-mode on)
LAZY_LINE = re.compile(r"tensor (\S+) \(size = \d+ MiB\) lazy read enabled")
REFUSAL = "cannot hold what every token reads"


def refusal_lines(res) -> int:
    """How many of the plugin's refusal lines (`spark: spark-gemma2: ...`) stderr holds."""
    return sum(1 for line in res.stderr.splitlines()
               if line.startswith("spark: spark-gemma2: ") and REFUSAL in line)


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def weight_bytes(model) -> dict:
    """The model's tensors by how a token reads them, from gguf-py: K2 (`ffn_up`) and V
    (`ffn_down_t`), or both side by side (`ffn_k2v`), by rows, the rest whole; `per_token` =
    ceil(bytes * k_f / F) of each row tensor."""
    whole = rows = per_token = 0
    row_names = []
    for t in gguf.GGUFReader(model).tensors:
        n = int(t.n_bytes)
        if t.name.endswith(ROW_TENSORS):
            rows += n
            per_token += -(-n * CFG["ffn_k"] // CFG["d_ff"])
            row_names.append(t.name)
        else:
            whole += n
    return {"whole": whole, "rows": rows, "per_token": per_token, "row_names": row_names}


@pytest.mark.parametrize("layout", ["separate", "paired"])
def test_a_model_whose_rows_do_not_fit_says_so_at_load_and_runs_the_same(request, layout):
    """SPARK_MEMORY one byte short of the whole model: one line at load with the file's sizes,
    the same greedy text; with room for everything, or SPARK_PAGING=never, no line. (The rows
    are 9 MiB: the context, which must fit beside the weights too, gets small ubatches.) The
    same for a file with K2 and V side by side (--pair-k2v), whose ffn_k2v are the rows."""
    shipped_f32 = request.getfixturevalue("shipped_f32" if layout == "separate" else "shipped_f32_paired")
    w = weight_bytes(shipped_f32)
    # -lv 4: the loader's lines (each tensor taken on demand) are at its info level
    small = ["-b", "16", "-ub", "16", "-lv", "4"]
    want, _ = llama_completion(shipped_f32, "ROMEO:", 16, True, *small)
    budget = MARGIN + w["whole"] + w["rows"] - 1
    text, res = llama_completion(shipped_f32, "ROMEO:", 16, True, *small,
                                 env={"SPARK_MEMORY": str(budget)})
    lines = [line for line in res.stderr.splitlines() if LOAD_LINE in line]
    assert len(lines) == 1, res.explain(f"not one load line: {lines}")
    print(f"\n{lines[0]}")
    for part in [f"({mib(budget)} by SPARK_MEMORY)", f"0.0 MiB made at load and {mib(w['whole'])} read whole",
                 f"K2 and V rows ({mib(w['rows'])}) are read", f"up to {mib(w['per_token'])} per token"]:
        assert part in lines[0], res.explain(f"{part!r} not in the load line")
    assert text == want, res.explain(f"{text!r} vs {want!r}")
    # the weights every token reads whole are pinned, where this user may lock that much
    pinned = f"the {mib(w['whole'])} of weights every token reads whole are pinned in memory"
    if may_lock(w["whole"]):
        assert res.stderr.count(pinned) == 1, res.explain("not pinned, or not said once")
    else:
        assert res.stderr.count(NOT_PINNED) == 1, res.explain("no line saying why not pinned")
    # the loader's default (--lazy-mode auto) reads no Spark tensor on demand
    assert not LAZY_LINE.search(res.stderr), res.explain("rows read on demand without --lazy-mode on")
    for env in [{"SPARK_MEMORY": str(MARGIN + w["whole"] + w["rows"])},
                {"SPARK_MEMORY": str(budget), "SPARK_PAGING": "never"}]:
        text, res = llama_completion(shipped_f32, "ROMEO:", 16, True, *small, env=env)
        assert LOAD_LINE not in res.stderr and text == want, res.explain(f"{env}")
        assert "pinned in memory" not in res.stderr, res.explain(f"{env}: pinned")


def may_lock(nbytes: int) -> bool:
    """Whether the tools this process starts may lock `nbytes`: CAP_IPC_LOCK in its effective
    set (root's, unless a container dropped it), or an RLIMIT_MEMLOCK that large."""
    cap_ipc_lock = 14
    status = open("/proc/self/status").read()
    cap_eff = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)[1], 16)
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return bool(cap_eff >> cap_ipc_lock & 1) or soft == resource.RLIM_INFINITY or soft >= nbytes


@pytest.mark.skipif(shutil.which("setpriv") is None or shutil.which("prlimit") is None,
                    reason="util-linux's setpriv and prlimit")
def test_weights_that_cannot_be_pinned_say_why_and_run_the_same(shipped_f32):
    """A user who may lock 64 KiB only (RLIMIT_MEMLOCK, without CAP_IPC_LOCK): rows that stream
    still run, with one line that says the weights read whole could not be pinned, the limit,
    and where the docs say what to do; the same greedy text."""
    w = weight_bytes(shipped_f32)
    small = ["-b", "16", "-ub", "16"]
    want, _ = llama_completion(shipped_f32, "ROMEO:", 16, True, *small)
    wrap = ("setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock",
            "prlimit", "--memlock=65536")
    text, res = llama_completion(shipped_f32, "ROMEO:", 16, True, *small, wrap=wrap,
                                 env={"SPARK_MEMORY": str(MARGIN + w["whole"] + w["rows"] - 1)})
    assert text == want, res.explain(f"{text!r} vs {want!r}")
    lines = [line for line in res.stderr.splitlines() if NOT_PINNED in line]
    assert len(lines) == 1, res.explain("not one line saying why not pinned")
    for part in [f"the {mib(w['whole'])} of weights", "RLIMIT_MEMLOCK 0.1 MiB", "Memory budgets"]:
        assert part in lines[0], lines[0]
    assert "are pinned in memory" not in res.stderr, res.explain("pinned beyond the limit")


@pytest.mark.parametrize("layout", ["separate", "paired"])
def test_lazy_mode_on_maps_the_rows_alone_and_the_logits_are_the_same(request, layout, tmp_path):
    """llama.cpp's `--lazy-mode on` (tensors read on demand): of a Spark model the loader takes
    K2 and V (or ffn_k2v) and nothing else that way (mapped, not read at load, no readahead);
    llama-perplexity's logits are bit for bit the default load's, with mmap and with
    `--load-mode none` (every other weight read into memory, the rows still mapped: the load
    plan then counts them as rows, not as weights made at load)."""
    model = request.getfixturevalue("shipped_f32" if layout == "separate" else "shipped_f32_paired")
    base = tmp_path / "default.kld"
    llama_perplexity(model, *PPL_ARGS, "-f", HELDOUT, "--kl-divergence-base", base)
    w = weight_bytes(model)
    rows = set(w["row_names"])
    for load in ["mmap", "none"]:
        # -lv 4: the loader's lines (each tensor taken on demand) are at its info level
        res = llama_perplexity(model, *PPL_ARGS, "--lazy-mode", "on", "--load-mode", load, "-lv", "4",
                               "--kl-divergence-base", base, "--kl-divergence")
        lazy = set(LAZY_LINE.findall(res.stderr))
        assert lazy == rows, res.explain(f"--load-mode {load}: on demand {sorted(lazy ^ rows)} "
                                         "(the row tensors and only they)")
        assert stat(res, "Mean    KLD") == 0.0, res.stdout
        assert stat(res, "Same top p") == 100.0, res.stdout
    budget = MARGIN + w["whole"] + w["rows"] - 1
    _, res = llama_completion(model, "ROMEO:", 4, True, "-b", "16", "-ub", "16", "--lazy-mode", "on",
                              "--load-mode", "none", env={"SPARK_MEMORY": str(budget)})
    lines = [line for line in res.stderr.splitlines() if LOAD_LINE in line]
    assert len(lines) == 1, res.explain(f"not one load line: {lines}")
    assert f"{mib(w['whole'])} made at load and 0.0 MiB read whole" in lines[0], lines[0]
    assert f"K2 and V rows ({mib(w['rows'])}) are read" in lines[0], lines[0]


@pytest.mark.parametrize("load", ["mmap", "none"])
def test_a_model_whose_always_read_set_does_not_fit_is_refused_at_load(shipped_f32, load):
    """One byte short of what must stay (weights read whole, or with `--load-mode none`, no mmap,
    every weight; plus the margin): llama-completion fails at load, before generating, naming the sizes; a bad
    SPARK_MEMORY is named and ignored."""
    w = weight_bytes(shipped_f32)
    extra = ["--load-mode", load]
    must_stay = w["whole"] + (w["rows"] if load == "none" else 0)
    budget = MARGIN + must_stay - 1
    text, res = llama_completion(shipped_f32, "ROMEO:", 16, True, *extra, check=False, once=True,
                                 env={"SPARK_MEMORY": str(budget)})
    assert res.returncode != 0 and text == "", res.explain("the load was not refused")
    # the plugin's own line: llama.cpp's "error loading model: ... refused by Spark's memory plan"
    # comes from a logger thread that a process exiting right after can cut short (common/log.cpp)
    assert refusal_lines(res) == 1, res.explain("not one refusal line from the plugin")
    made = re.search(r"([0-9.]+) MiB of weights made at load", res.stderr)
    mapped = re.search(r"\+ ([0-9.]+) MiB of mapped weights read whole", res.stderr)
    assert made and mapped, res.explain("sizes not named")
    if load == "mmap":
        assert (made[1], mapped[1]) == ("0.0", mib(w["whole"])[:-4]), res.explain("sizes")
    else:  # every weight made at load (a tied output may be a second copy); nothing mapped
        assert float(made[1]) >= float(mib(must_stay)[:-4]) and mapped[1] == "0.0", res.explain("sizes")
    assert f"({mib(budget)} by SPARK_MEMORY)" in res.stderr, res.explain("the memory left not named")
    _, res = llama_completion(shipped_f32, "ROMEO:", 4, True, *extra, env={"SPARK_MEMORY": "lots"})
    assert "SPARK_MEMORY: 'lots' is not a size" in res.stderr, res.explain("the bad value not named")


def test_llama_server_spark_run_and_python_refuse_it_too(shipped_f32):
    """The same refusal through llama-server (exits non-zero before listening), `spark run`
    (the plugin's line, then `spark: error: cannot load ...: <the error>`, exit 1) and
    llama-cpp-python (Llama(...) raises ValueError; the plugin's line on stderr)."""
    w = weight_bytes(shipped_f32)
    env = {"SPARK_MEMORY": str(MARGIN + w["whole"] - 1)}
    res = run([tool("llama-server"), "-m", shipped_f32, "--port", "0", "-t", THREADS, "--no-webui"],
              env={**tool_env(True), **env}, timeout=60, check=False)
    assert res.returncode != 0 and REFUSAL in res.stderr + res.stdout, res.explain("llama-server")
    res = run([spark_binary("spark"), "run", "-m", shipped_f32, "-p", "ROMEO:", "-n", "4"],
              env={**tool_env(False, stats=False), **env}, timeout=60, check=False)
    assert res.returncode == 1 and res.stdout == "", res.explain("spark run")
    assert refusal_lines(res) == 1 and re.search(
        r"^spark: error: cannot load .*: spark-gemma2: refused by Spark's memory plan: "
        r"[0-9.]+ MiB must stay in memory, [0-9.]+ MiB is left", res.stderr, re.M), \
        res.explain("spark run: no refusal")
    llama_cpp_installed()
    script = f"from llama_cpp import Llama; Llama(model_path={str(shipped_f32)!r}, verbose=True)"
    res = run([sys.executable, "-c", script], env={**python_env(), **env}, timeout=60, check=False)
    assert res.returncode == 1 and "ValueError" in res.stderr, res.explain("llama-cpp-python")
    assert refusal_lines(res) == 1, res.explain("the plugin's line not on stderr")


CONTEXT_REFUSAL = re.compile(r"^spark: spark-gemma2: the KV cache \(([0-9.]+) MiB\) would not fit "
                             r"in the memory left \(([0-9.]+) MiB by SPARK_MEMORY\)", re.M)


def test_a_context_whose_kv_cache_does_not_fit_is_refused_before_it_is_made(shipped_f32):
    """Weights that fit with 256 MiB to spare (patch 0022): a 256-token context runs; a context
    whose KV cache takes more than what is left is refused before the cache is allocated, with
    one line naming its size (at least the f16 K and V rows of the model's non-sliding layers
    for every position) and llama.cpp's `failed to initialize the context`; llama-server too."""
    w = weight_bytes(shipped_f32)
    env = {"SPARK_MEMORY": str(MARGIN + w["whole"] + w["rows"] + (256 << 20))}
    want, _ = llama_completion(shipped_f32, "ROMEO:", 8, True)
    text, res = llama_completion(shipped_f32, "ROMEO:", 8, True, "-c", "256", env=env)
    assert text == want and not CONTEXT_REFUSAL.search(res.stderr), res.explain("-c 256")
    n_ctx = 1 << 19
    text, res = llama_completion(shipped_f32, "ROMEO:", 8, True, "-c", str(n_ctx), check=False,
                                 once=True, env=env)
    found = CONTEXT_REFUSAL.findall(res.stderr)
    assert res.returncode != 0 and text == "" and len(found) == 1, res.explain("not refused once")
    kv_bytes = float(found[0][0]) * (1 << 20)
    global_layers = CFG["n_layers"] // 2  # Gemma-2: every other layer slides
    assert kv_bytes >= global_layers * n_ctx * 2 * CFG["n_kv_heads"] * CFG["head_dim"] * 2, found
    print("\n" + next(line for line in res.stderr.splitlines() if CONTEXT_REFUSAL.match(line)))
    res = run([tool("llama-server"), "-m", shipped_f32, "-c", str(n_ctx), "--port", "0", "-t",
               THREADS, "--no-webui"], env={**tool_env(True), **env}, timeout=60, check=False)
    assert res.returncode != 0 and len(CONTEXT_REFUSAL.findall(res.stderr)) == 1, \
        res.explain("llama-server")
