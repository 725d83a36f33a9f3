"""llama-cpp-python (`from llama_cpp import Llama`), installed by tools/python.sh into .venv and
bound to the project's llama.cpp build (target/upstream/lib), running the shipped Spark model
with the plugin (GGML_BACKEND_PATH), as README's "Python" section shows: greedy text equal to
`spark run`'s, the plugin's SPARK_STATS=1 table at the Python process's exit, the k dial through
`kv_overrides`, `create_chat_completion` with the chat template in the file, Python exceptions
for bad model files; and that its ctypes structs have llama.h's layout, and tools/python.sh
refuses headers that differ.

Each case runs in its own Python process (RUNNER): the plugin prints its table at process exit,
and a crash in the C library must show as a crash, not take pytest down."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from upstream_helpers import (CFG, PKG_VERSION, ROOT, TARGET_KEEP, UPSTREAM, Result,
                              assert_k_dial, assert_stats_table, gemma2_prompt,
                              llama_cpp_installed, parse_stats, plugin, python_env, run,
                              spark_run_text)

PROMPTS = ["ROMEO:", "JULIET.\nO Romeo, Romeo, wherefore"]
N_PREDICT = 32
SMALL_K = 41  # half of the shipped model's k_f = 82, as test_completion.py
CHAT_MESSAGE = "Who is there?"
# What a user's script passes: the shipped model's context, 2 threads, a fixed seed.
LLAMA_ARGS = {"n_ctx": 256, "n_threads": 2, "n_threads_batch": 2, "seed": 1, "verbose": False}

# Runs the calls of a JSON spec on one Llama and prints one JSON line of results; an exception
# of the constructor or a call is reported as {"error": {"type", "message"}} (exit status 0).
RUNNER = r'''
import json, sys
spec = json.loads(sys.argv[1])
try:
    from llama_cpp import Llama
    llm = Llama(model_path=spec["model"], **spec["llama"])
    out = {"chat_format": llm.chat_format, "calls": []}
    for method, kwargs in spec["calls"]:
        res = getattr(llm, method)(**kwargs)
        if kwargs.get("stream"):
            res = list(res)
        out["calls"].append(res)
except Exception as e:
    out = {"error": {"type": type(e).__name__, "message": str(e)}}
print(json.dumps(out))
'''


def run_llama(model: Path, calls: list, llama: dict | None = None, with_plugin: bool = True,
              stats: bool = True) -> tuple[dict, Result]:
    """RUNNER on `model` with Llama(**LLAMA_ARGS, **llama) and `calls` ([method, kwargs]);
    returns its JSON output and the process (which must exit 0)."""
    llama_cpp_installed()
    spec = {"model": str(model), "llama": {**LLAMA_ARGS, **(llama or {})}, "calls": calls}
    res = run([sys.executable, "-c", RUNNER, json.dumps(spec)], env=python_env(with_plugin, stats))
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        pytest.fail(res.explain(f"no JSON result line in stdout {res.stdout!r}"), pytrace=False)
    return out, res


def greedy(prompt: str, n: int = N_PREDICT, **extra) -> list:
    return ["create_completion", {"prompt": prompt, "max_tokens": n, "temperature": 0, **extra}]


@pytest.fixture(scope="module")
def python_runs(shipped_f32):
    """prompt -> (text, usage, Result) of a greedy completion in Python, plugin, SPARK_STATS=1."""
    runs = {}
    for prompt in PROMPTS:
        out, res = run_llama(shipped_f32, [greedy(prompt)])
        assert "error" not in out, res.explain(f"{prompt!r}: {out}")
        completion = out["calls"][0]
        assert completion["usage"]["completion_tokens"] == N_PREDICT, res.explain(f"{out}")
        runs[prompt] = (completion["choices"][0]["text"], completion["usage"], res)
    return runs


def test_llama_cpp_loads_the_projects_libllama():
    """`import llama_cpp` with no LLAMA_CPP_LIB_PATH loads target/upstream/lib/libllama.so (the
    package's lib directory is a link to it), not a library of its own."""
    llama_cpp_installed()
    res = run([sys.executable, "-c", "import os, llama_cpp; "
               "print(os.path.realpath(llama_cpp.llama_cpp._lib._name)); "
               "print(os.path.realpath(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib')))"],
              env=python_env(False, False))
    loaded, libdir = res.stdout.split()
    assert loaded == os.path.realpath(UPSTREAM / "lib" / "libllama.so"), res.explain(loaded)
    assert libdir == os.path.realpath(UPSTREAM / "lib"), res.explain(libdir)


def test_ctypes_structs_have_the_layout_of_llama_h(tmp_path):
    """llama-cpp-python's bindings are hand-written ctypes copies of llama.h's structs. For every
    Structure/Union of llama_cpp.llama_cpp that llama.h declares, its size and each field's
    offset equal what the C compiler gives for our llama.h (the header the libraries were built
    with). A field the C struct has as an anonymous union (llama_model_kv_override's value) is
    placed by its first member."""
    llama_cpp_installed()
    header = UPSTREAM / "include" / "llama.h"
    assert header.is_file(), f"{header} is missing: run `bash tools/upstream.sh`"
    text = header.read_text()
    # the ctypes side: {struct: (size, [(field, c_name, offset)])}
    res = run([sys.executable, "-c", r'''
import ctypes, json, llama_cpp.llama_cpp as L
out = {}
for name, obj in vars(L).items():
    if isinstance(obj, type) and issubclass(obj, (ctypes.Structure, ctypes.Union)) \
            and obj.__module__ == L.__name__ and hasattr(obj, "_fields_"):
        fields = []
        for f in obj._fields_:
            first = getattr(f[1], "_fields_", None)
            fields.append([f[0], first[0][0] if first else None, getattr(obj, f[0]).offset])
        out[name] = [ctypes.sizeof(obj), fields]
print(json.dumps(out))'''], env=python_env(False, False))
    ours = json.loads(res.stdout)
    declared = {name: body for name in ours if (body := struct_body(text, name)) is not None}
    assert len(declared) >= 15, f"only {sorted(declared)} of {sorted(ours)} found in {header}"
    lines = []
    for name, body in declared.items():
        size, fields = ours[name]
        lines.append(f'printf("{name} sizeof %zu\\n", sizeof(struct {name}));')
        for field, first, _ in fields:
            member = field if re.search(r"\b%s\b" % field, body) else first
            assert member and re.search(r"\b%s\b" % member, body), \
                f"{name}.{field}: no such member in llama.h's struct {name}:\n{body}"
            lines.append(f'printf("{name} .{field} %zu\\n", offsetof(struct {name}, {member}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"llama.h\"\n"
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    run(["cc", "-std=c11", "-I", UPSTREAM / "include", src, "-o", exe])
    c_side = {key: int(value) for key, value in
              (line.rsplit(" ", 1) for line in run([exe]).stdout.splitlines())}
    wrong, gaps = [], {}
    for name in declared:
        size, fields = ours[name]
        bad = [f"{name}.{field}: offset C {c_side[f'{name} .{field}']}, ctypes {off}"
               for field, _, off in fields if c_side[f"{name} .{field}"] != off]
        if c_side[f"{name} sizeof"] != size:
            bad.append(f"sizeof(struct {name}): C {c_side[f'{name} sizeof']}, ctypes {size}")
        if name in KNOWN_GAPS and bad == [KNOWN_GAPS[name][0].format(size=size)]:
            gaps[name] = KNOWN_GAPS[name][1]
        else:
            wrong += bad
    assert not wrong, "llama-cpp-python's ctypes structs differ from llama.h:\n" + "\n".join(wrong)
    assert sorted(gaps) == sorted(KNOWN_GAPS), f"known gaps {sorted(KNOWN_GAPS)}, seen {gaps}"
    print(f"\n{len(declared)} structs, {sum(len(ours[n][1]) for n in declared)} fields: the same "
          f"layout but for the known gaps {gaps} ({', '.join(sorted(declared))})")


# Structs whose ctypes copy in llama-cpp-python 0.3.36 is known to differ from its own vendored
# llama.h (which is ours): (the only difference allowed, why it does not matter).
KNOWN_GAPS = {
    "llama_opt_params": (
        "sizeof(struct llama_opt_params): C 48, ctypes {size}",
        "its copy leaves out the last field, optimizer_type: llama_opt_init (training) would get "
        "a short struct; Llama never calls it"),
}


def struct_body(text: str, name: str) -> str | None:
    """The text between the braces of `struct name {...}` in a header (nested braces kept)."""
    m = re.search(r"\bstruct\s+%s\s*\{" % name, text)
    if not m:
        return None
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[m.end():i - 1]


def test_greedy_text_is_the_spark_run_text(shipped_f32, python_runs):
    """Llama(...)(prompt, temperature=0): llama_tokenize with BOS, the prompt in one batch, then
    one token at a time, f16 KV cache, argmax; `spark run` does the same, so the texts are equal
    and so are the kernels' per-layer statistics (the same tokens through the same kernels)."""
    for prompt, (text, _, res) in python_runs.items():
        want, spark_res = spark_run_text(shipped_f32, prompt, N_PREDICT, "--spark-stats")
        print(f"\n{prompt!r}\n  Python:    {text!r}\n  spark run: {want!r}")
        assert text == want, (f"{prompt!r}: llama-cpp-python gave\n  {text!r}\n`spark run` gave"
                              f"\n  {want!r}\n{res.command}\n{spark_res.command}")
        assert parse_stats(res.stderr).rows == parse_stats(spark_res.stderr).rows, (
            f"{prompt!r}: per-layer statistics differ\n Python: {parse_stats(res.stderr).rows}"
            f"\n spark run: {parse_stats(spark_res.stderr).rows}")


def test_spark_stats_table_at_the_end_of_the_python_process(python_runs, shipped_f32):
    """SPARK_STATS=1: the plugin's table, one row per layer, at the Python process's exit; every
    token went through the sparse FFN (keep rate near k_f/F) and the sparse attention. Without
    GGML_BACKEND_PATH nothing of the plugin is in the process: no table, the dense graph."""
    for prompt, (_, usage, res) in python_runs.items():
        stats = assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, explain=res.explain)
        # the prompt's tokens and all but the last generated one went through every layer
        n_prompt = usage["prompt_tokens"]
        assert stats.rows[0].tokens == n_prompt + N_PREDICT - 1, res.explain(
            f"{prompt!r}: ffn_tokens {stats.rows[0].tokens}, want {n_prompt} + {N_PREDICT} - 1")
        print(f"\n{prompt!r}:\n" + "\n".join(stats.lines))
    out, res = run_llama(shipped_f32, [greedy(PROMPTS[0], 4)], with_plugin=False)
    assert "error" not in out, res.explain(f"{out}")
    assert not parse_stats(res.stderr).lines, res.explain("spark-stats lines without the plugin")


def test_kv_overrides_ffn_k_is_the_k_dial(shipped_f32, python_runs):
    """Llama(kv_overrides={"spark-gemma2.spark.ffn_k": 41}) is llama.cpp's --override-kv: the
    keep rate drops to ~41/1024, and text and statistics equal `spark run --spark-ffn-k 41`."""
    prompt = PROMPTS[0]
    out, res = run_llama(shipped_f32, [greedy(prompt)],
                         llama={"kv_overrides": {"spark-gemma2.spark.ffn_k": SMALL_K}})
    assert "error" not in out, res.explain(f"{out}")
    text = out["calls"][0]["choices"][0]["text"]
    full_k_run = python_runs[prompt][2]
    assert_k_dial(res, text, full_k_run.stderr, shipped_f32, prompt, N_PREDICT, SMALL_K)


def test_create_chat_completion_uses_the_models_template(shipped_f32_chat, server_factory):
    """A model file with Gemma-2's chat template (tokenizer.chat_template): Llama picks it
    (chat_format "chat_template.default") and create_chat_completion, plain and streamed, gives
    the greedy text of the prompt the template renders, and the same reply as llama-server's
    /v1/chat/completions on the same file (llama.cpp's own template engine)."""
    messages = [{"role": "user", "content": CHAT_MESSAGE}]
    chat = {"messages": messages, "max_tokens": N_PREDICT, "temperature": 0}
    out, res = run_llama(shipped_f32_chat, [
        ["create_chat_completion", chat],
        ["create_chat_completion", {**chat, "stream": True}],
        greedy(gemma2_prompt(CHAT_MESSAGE))])
    assert "error" not in out, res.explain(f"{out}")
    assert out["chat_format"] == "chat_template.default", res.explain(
        f"chat_format {out['chat_format']!r}: the file's template was not used")
    plain, streamed, rendered = out["calls"]
    content = plain["choices"][0]["message"]["content"]
    assert content.strip() and plain["usage"]["completion_tokens"] == N_PREDICT, plain
    chunks = [c["choices"][0]["delta"] for c in streamed]
    assert chunks[0].get("role") == "assistant", chunks[:2]
    assert "".join(d.get("content") or "" for d in chunks) == content, (chunks, content)
    assert rendered["choices"][0]["text"] == content, (rendered, content)
    assert rendered["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"], (rendered, plain)

    srv = server_factory(shipped_f32_chat, with_plugin=True)
    got = srv.post("/v1/chat/completions", {**chat, "seed": 1, "cache_prompt": False})
    assert got["choices"][0]["message"]["content"] == content, (
        f"llama-server: {got['choices'][0]['message']['content']!r}\nPython: {content!r}")
    assert got["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"], (got, plain)
    print(f"\nchat (the file's Gemma-2 template) {CHAT_MESSAGE!r} -> {content!r}")


def corrupt_files(tmp: Path, model: Path) -> dict:
    """name -> (path, what llama.cpp says with verbose=True)."""
    text = tmp / "not-a-model.gguf"
    text.write_text("hello, this is not a GGUF file\n")
    truncated = tmp / "truncated.gguf"
    with open(model, "rb") as f:
        truncated.write_bytes(f.read(100_000))
    return {"missing": (tmp / "no-such-model.gguf", None),
            "not-gguf": (text, "invalid magic characters"),
            "truncated": (truncated, "not within the file bounds"),
            "directory": (tmp, "failed to read magic")}


@pytest.mark.parametrize("case", ["missing", "not-gguf", "truncated", "directory"])
def test_bad_model_file_raises_a_python_exception(shipped_f32, tmp_path, case):
    """A missing, foreign, truncated model file or a directory: Llama(...) raises ValueError
    naming the path (the process goes on: no crash), and with verbose=True llama.cpp's own
    reason is in stderr. Uncaught, the exception ends the script with exit status 1."""
    path, reason = corrupt_files(tmp_path, shipped_f32)[case]
    for verbose in (False, True):
        out, res = run_llama(path, [], llama={"verbose": verbose})
        assert out.get("error", {}).get("type") == "ValueError", res.explain(f"{case}: {out}")
        assert str(path) in out["error"]["message"], res.explain(f"{case}: {out}")
        if verbose and reason:
            assert reason in res.stderr, res.explain(f"{case}: {reason!r} not in stderr")
    script = f"from llama_cpp import Llama; Llama(model_path={str(path)!r}, verbose=False)"
    res = run([sys.executable, "-c", script], env=python_env(), check=False)
    assert res.returncode == 1, res.explain(f"{case}: exit status {res.returncode}, want 1")
    assert re.search(r"^ValueError: .*" + re.escape(str(path)), res.stderr, re.M), \
        res.explain(f"{case}: no ValueError naming the file")


@pytest.mark.parametrize("change", ["allowed-lines", "struct-field", "ggml-enum", "mtmd-c-api",
                                    "mtmd-cplusplus"])
def test_python_sh_checks_the_headers(tmp_path, change):
    """tools/python.sh --check-only against a copy of our headers: the two version lines of
    llama.h and mtmd.h's C++-only part may differ; a struct field of llama.h, an enum of ggml.h
    or a C declaration of mtmd.h must not (exit 1, naming the header and the line)."""
    inc = tmp_path / "include"
    shutil.copytree(UPSTREAM / "include", inc)
    # change: (header, old text, new text, the new text's mark in the refusal or None: allowed)
    edits = {
        "allowed-lines": ("llama.h", "#define LLAMA_SESSION_VERSION ",
                          "#define LLAMA_SESSION_VERSION 99 //", None),
        "struct-field": ("llama.h", "        uint32_t n_ctx;  ",
                         "        uint32_t n_ctx_new; uint32_t n_ctx;  ", "n_ctx_new"),
        "ggml-enum": ("ggml.h", "        GGML_TYPE_F16     = 1,",
                      "        GGML_TYPE_F16     = 7,", "GGML_TYPE_F16     = 7"),
        "mtmd-c-api": ("mtmd.h", "MTMD_API void mtmd_free(", "MTMD_API void mtmd_free_all(",
                       "mtmd_free_all"),
        "mtmd-cplusplus": ("mtmd.h", "#ifdef __cplusplus\nstruct mtmd_memory_usage {",
                           "#ifdef __cplusplus\nstruct extra {};\nstruct mtmd_memory_usage {",
                           None),
    }
    header, old, new, mark = edits[change]
    text = (inc / header).read_text()
    assert text.count(old) == 1, f"{header}: {old!r} occurs {text.count(old)} times"
    (inc / header).write_text(text.replace(old, new))
    env = {**os.environ, "SPARK_UPSTREAM_DIR": str(tmp_path)}
    res = run(["bash", ROOT / "tools" / "python.sh", "--check-only"], env=env, check=False)
    if mark:
        assert res.returncode == 1, res.explain(f"{change}: not refused")
        assert f"{PKG_VERSION}'s {header} differs" in res.stderr, res.explain(change)
        shown = [line for line in res.stderr.splitlines() if line.startswith("> ")]
        assert any(mark in line for line in shown), res.explain(
            f"{change}: the differing line ({mark!r}) is not shown as ours")
    else:
        assert res.returncode == 0, res.explain(f"{change}: refused")


def test_a_quantized_kv_cache_from_python(shipped_f32):
    """What a user's script passes for a long context: Llama(type_k=, type_v=, flash_attn=True)
    with ggml's GGML_TYPE_Q8_0 (8): flash attention gives way to spark-gemma2's own attention,
    which reads the q8_0 cache; the text is `spark run --cache-type q8_0`'s."""
    q8_0 = 8
    out, res = run_llama(shipped_f32, [greedy(PROMPTS[0])],
                         llama={"type_k": q8_0, "type_v": q8_0, "flash_attn": True})
    assert "error" not in out, res.explain(f"{out}")
    text = out["calls"][0]["choices"][0]["text"]
    want, _ = spark_run_text(shipped_f32, PROMPTS[0], N_PREDICT, "--cache-type", "q8_0")
    assert text == want, res.explain(f"Python gave {text!r}, spark run {want!r}")
    assert_stats_table(res.stderr, CFG["n_layers"], TARGET_KEEP, explain=res.explain)
