"""tools/bench-gemma3n.sh, the alternated with/without-plugin llama-bench rounds that
docs/PERF.md's Gemma 3n decode ratios come from: its table adds up, and bad arguments get a
named error and no table."""

from __future__ import annotations

import re
import subprocess
from statistics import median

from gemma3n_helpers import ROOT

SCRIPT = ROOT / "tools" / "bench-gemma3n.sh"
ROW = re.compile(r"^\| (\d+) \| (\S+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$")
SUMMARY = re.compile(r"^(\S+): median ([\d.]+)x, range ([\d.]+)-([\d.]+)x over (\d+) rounds$")


def bench(*args, timeout=300, cwd="/") -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)


def test_rounds_table_and_medians(tiny):
    """Two rounds of tg4 on the tiny model, named by a path relative to the caller's directory
    (the script moves to the repository root): exit 0, one row per round with ratio = Spark /
    stock, the median of those ratios, and --quiet leaves stderr empty. The script itself refuses a Spark side whose llama-bench
    backends lack "Spark" (and a stock side that has it), so exit 0 means both sides ran as
    labelled (test_a_plugin_that_does_not_load_stops_the_rounds)."""
    model = tiny["f32"]
    proc = bench(model.name, "-n", 2, "--quiet", "--", "-p", 0, "-n", 4, "-r", 1,
                 cwd=model.parent)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr}\n{proc.stdout}"
    assert proc.stderr == "", f"--quiet printed:\n{proc.stderr}"
    rows = [ROW.match(line) for line in proc.stdout.splitlines()]
    rows = [m for m in rows if m]
    assert [(m[1], m[2]) for m in rows] == [("1", "tg4"), ("2", "tg4")], proc.stdout
    for m in rows:
        stock, spark, ratio = float(m[3]), float(m[4]), float(m[5])
        assert stock > 0 and spark > 0, proc.stdout
        # the speeds are printed to 0.01 t/s and the ratio to 0.001: equal within that rounding
        slack = spark / stock * (0.005 / spark + 0.005 / stock) + 0.0005
        assert abs(ratio - spark / stock) <= slack, f"ratio {ratio} != {spark} / {stock}"
    summary = [SUMMARY.match(line) for line in proc.stdout.splitlines()]
    summary = [m for m in summary if m]
    assert len(summary) == 1 and summary[0][1] == "tg4" and summary[0][5] == "2", proc.stdout
    ratios = [float(m[5]) for m in rows]
    assert abs(float(summary[0][2]) - median(ratios)) < 2e-3, proc.stdout
    assert float(summary[0][3]) == min(ratios) and float(summary[0][4]) == max(ratios), proc.stdout


def test_progress_names_each_round_and_side(tiny):
    """Without --quiet, stderr says the CPU, the file and each round's side in the flipped
    order (stock first in odd rounds, Spark first in even ones)."""
    proc = bench(tiny["f32"], "-n", 2, "--", "-p", 0, "-n", 2, "-r", 1)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr}"
    sides = re.findall(r"round (\d)/2, (stock|spark)", proc.stderr)
    assert sides == [("1", "stock"), ("1", "spark"), ("2", "spark"), ("2", "stock")], proc.stderr
    assert str(tiny["f32"]) in proc.stderr and "CPUs" in proc.stderr, proc.stderr


def test_a_plugin_that_does_not_load_stops_the_rounds(tiny, tmp_path):
    """--plugin naming a file ggml cannot load: llama-bench then runs without the Spark backend,
    which would compare stock with stock; the script stops after that run with exit 1, the end
    of its log (ggml's load error) and a line saying so, and prints no table."""
    bogus = tmp_path / "libggml-spark.so"
    bogus.write_text("not a shared library\n")
    proc = bench(tiny["f32"], "-n", 2, "--plugin", bogus, "--quiet", "--", "-p", 0, "-n", 2, "-r", 1)
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr}"
    assert proc.stdout == "", f"a table from a failed comparison:\n{proc.stdout}"
    assert "failed to load" in proc.stderr and str(bogus) in proc.stderr, proc.stderr
    assert "round 1: llama-bench ran without the Spark backend" in proc.stderr, proc.stderr


def test_bad_arguments_are_named_errors(tmp_path):
    """A missing file, a bad count, an unknown option, no file: non-zero exit, a line naming
    what is wrong, nothing on stdout, and no llama-bench started (each returns at once)."""
    missing = tmp_path / "nope.gguf"
    cases = [
        ((missing,), 1, f"{missing}: no such file"),
        ((missing, "-n", 0), 2, "'0' is not a count"),
        ((missing, "-t", "two"), 2, "'two' is not a count"),
        ((missing, "-n"), 2, "'' is not a count"),
        ((missing, "--rounds", 3), 2, "unknown argument '--rounds'"),
        ((), 2, "give a Gemma 3n GGUF"),
        ((missing, "--plugin"), 2, "--plugin needs a path"),
    ]
    model = tmp_path / "model.gguf"
    model.write_bytes(b"")
    cases.append(((model, "--plugin", missing), 1, f"--plugin '{missing}': no such file"))
    for args, rc, message in cases:
        proc = bench(*args, timeout=30)
        assert proc.returncode == rc, f"{args}: exit {proc.returncode}, want {rc}\n{proc.stderr}"
        assert message in proc.stderr, f"{args}: stderr lacks {message!r}:\n{proc.stderr}"
        assert proc.stdout == "", f"{args}: stdout {proc.stdout!r}"

