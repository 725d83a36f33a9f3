#!/usr/bin/env python3
"""Every door a person uses, with a Spark model larger than the memory left to it.

    .venv/bin/python tools/doors-under-budget.py MODEL.gguf --leave GB [-n 16] [--quiet]
                                                 [--upstream DIR] [--spark PATH]

For each door (llama-completion, llama-cli one turn, llama-server's /completion, `spark run`,
llama-cpp-python) the same greedy request (temperature 0, seed 1, 2 threads) runs twice: with
the model in memory (its file read into the page cache first), then under the budget
(tools/memory-budget.py --leave GB --evict MODEL: the rest of the memory held away, the file
dropped from the page cache, so the run starts cold). A door passes when both runs exit 0 and
give the same text, and the budgeted run printed the plugin's load-time line (the model's rows
do not all fit: docs/USAGE.md, "A Spark model larger than the memory left to it"); a refused
load is reported with its message. Prints one row per door: wall seconds in memory and under
the budget, the line seen, whether the weights every token reads whole were pinned (the
plugin's line: pinned, not pinned, or - for none), the same text. Exit status 1 when a door fails.

Too slow for CI (each budgeted run reads its model from storage); the CI checks of the same
paths with SPARK_MEMORY standing in for the memory are tests/python/upstream/test_paging.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"
LOAD_LINE = "do not all fit in the memory left"
PIN_LINE = re.compile(r"weights every token reads whole (are pinned|could not be pinned) in memory")
PROG = "doors-under-budget"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_reply(stdout: str) -> str:
    """llama-cli's reply: from the echoed `> PROMPT` line (kept, so that a reply of blank lines,
    which a synthetic model can give, still compares line for line) to its `[ Prompt: ... ]`
    speeds; "" when either is missing."""
    lines = stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("> ")), None)
    end = next((i for i in range(start or 0, len(lines)) if lines[i].startswith("[ Prompt:")), None)
    return "" if start is None or end is None else "\n".join(lines[start:end])


class Doors:
    def __init__(self, model: Path, n: int, upstream: Path, spark: Path):
        self.model, self.n, self.upstream, self.spark = model, n, upstream, spark
        plugin = upstream / "lib" / "libggml-spark.so"
        self.env = {**os.environ, "GGML_BACKEND_PATH": str(plugin)}
        self.env.pop("SPARK_MEMORY", None)
        self.greedy = ["--temp", "0", "--seed", "1", "-t", "2"]

    def tool(self, name: str) -> str:
        return str(self.upstream / "bin" / name)

    def commands(self) -> dict[str, list[str]]:
        m, n = str(self.model), str(self.n)
        py = ("import sys; from llama_cpp import Llama; "
              f"llm = Llama(model_path={m!r}, n_ctx=512, n_threads=2, verbose=True); "
              f"out = llm({PROMPT!r}, max_tokens={n}, temperature=0, seed=1); "
              "sys.stdout.write(out['choices'][0]['text'])")
        return {
            "llama-completion": [self.tool("llama-completion"), "-m", m, "-p", PROMPT, "-n", n,
                                 *self.greedy, "-no-cnv", "--no-display-prompt", "--no-warmup"],
            "llama-cli": [self.tool("llama-cli"), "-m", m, "--chat-template", "chatml", "-st",
                          "-p", PROMPT, "-n", n,
                          *self.greedy, "--simple-io", "--no-warmup"],
            "spark run": [str(self.spark), "run", "-m", m, "-p", PROMPT, "-n", n, "--temp", "0",
                          "--seed", "1", "-t", "2"],
            "llama-cpp-python": [sys.executable, "-c", py],
        }

    def run(self, door: str, budget: list[str]) -> tuple[int, str, str, float]:
        """(exit status, text, stderr, seconds) of one door, under `budget` (a command prefix)."""
        t0 = time.monotonic()
        if door == "llama-server":
            return self.server(budget, t0)
        p = subprocess.run(budget + self.commands()[door], env=self.env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=1800)
        text = cli_reply(p.stdout) if door == "llama-cli" else p.stdout
        return p.returncode, text, p.stderr, time.monotonic() - t0

    def server(self, budget: list[str], t0: float) -> tuple[int, str, str, float]:
        port = free_port()
        cmd = budget + [self.tool("llama-server"), "-m", str(self.model), "--host", "127.0.0.1",
                        "--port", str(port), "-np", "1", "-c", "512", "-t", "2", "--no-webui"]
        log = open(f"/tmp/{PROG}-server-{port}.log", "w+")
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        text, status = "", 1
        try:
            while time.monotonic() - t0 < 1800 and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
            if proc.poll() is None:
                body = json.dumps({"prompt": PROMPT, "n_predict": self.n, "temperature": 0,
                                   "seed": 1}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=1800) as r:
                    text, status = json.load(r)["content"], 0
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.seek(0)
        return status, text, log.read(), time.monotonic() - t0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--leave", type=float, required=True, help="GB of memory left to each door")
    ap.add_argument("-n", type=int, default=16, help="tokens to generate (default 16)")
    ap.add_argument("--upstream", type=Path, default=ROOT / "target" / "upstream")
    ap.add_argument("--spark", type=Path, default=ROOT / "target" / "debug" / "spark")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    a = ap.parse_args(argv)
    if not a.model.is_file():
        print(f"{PROG}: {a.model}: no such model file", file=sys.stderr)
        return 2
    for need in [a.upstream / "bin" / "llama-server", a.spark]:
        if not need.exists():
            print(f"{PROG}: {need} is missing (bash tools/upstream.sh; cargo build)", file=sys.stderr)
            return 2
    say = (lambda *_: None) if a.quiet else (lambda msg: print(f"{PROG}: {msg}", file=sys.stderr))
    doors = Doors(a.model, a.n, a.upstream, a.spark)
    holder = [sys.executable, str(ROOT / "tools" / "memory-budget.py"), "--quiet"]
    budget = holder + ["--leave", str(a.leave), "--evict", str(a.model), "--"]
    failed = 0
    print(f"{a.model.name}, {a.leave} GB left, {a.n} tokens, greedy")
    print("| door | in memory s | budget s | load line | always-read set | same text | result |")
    print("|---|---|---|---|---|---|---|")
    for door in ["llama-completion", "llama-cli", "llama-server", "spark run", "llama-cpp-python"]:
        say(f"{door}: in memory")
        subprocess.run(["cat", str(a.model)], stdout=subprocess.DEVNULL, check=True)
        rc0, want, _, s0 = doors.run(door, [])
        say(f"{door}: {a.leave} GB left")
        rc, got, err, s = doors.run(door, budget)
        line = LOAD_LINE in err
        left = re.search(r"fit in the memory left \(([0-9.]+ [GM]iB) by ([A-Za-z_. ']+)\)", err)
        pin = PIN_LINE.search(err)
        pinned = "-" if not pin else ("pinned" if pin[1] == "are pinned" else "not pinned")
        refused = next((ln for ln in err.splitlines() if "cannot hold what every token" in ln), "")
        ok = rc0 == 0 and rc == 0 and got == want and bool(want.strip()) and line
        failed += not ok
        result = "ok" if ok else (f"refused: {refused}" if refused else f"FAILED (exit {rc0}/{rc})")
        print(f"| {door} | {s0:.1f} | {s:.1f} | {'yes: ' + left[1] + ' left' if left else 'no'} | "
              f"{pinned} | {'yes' if got == want else 'no'} | {result} |", flush=True)
        if not ok and not a.quiet:
            spark_lines = "\n".join(ln for ln in err.splitlines() if "spark" in ln)
            print(f"  in memory: {want!r}\n  budget:    {got!r}\n  spark lines:\n{spark_lines}",
                  file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
