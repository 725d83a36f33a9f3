"""The upstream-tool tests' own retry on a lost capture (`run_until_complete`), on a stand-in
command: how many runs it makes and which result it returns, on each path."""

from __future__ import annotations

import sys

from upstream_helpers import LOST_CAPTURE_RUNS, run_until_complete

# Counts its runs in a file; prints "end" from run `complete_from` on, exits with `status`.
SCRIPT = """
import sys
from pathlib import Path
counter, complete_from, status = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
print(f"run {n}" + (" end" if n >= complete_from else ""))
sys.exit(status)
"""


def stand_in(tmp_path, complete_from: int, status: int = 0):
    counter = tmp_path / "runs"
    res = run_until_complete([sys.executable, "-c", SCRIPT, counter, complete_from, status],
                             lambda r: r.stdout.rstrip().endswith("end"), check=False)
    return res, int(counter.read_text())


def test_a_complete_first_run_is_not_repeated(tmp_path):
    res, runs = stand_in(tmp_path, complete_from=1)
    assert (runs, res.stdout.strip()) == (1, "run 1 end")


def test_a_lost_capture_is_run_again_until_complete(tmp_path):
    res, runs = stand_in(tmp_path, complete_from=2)
    assert (runs, res.stdout.strip()) == (2, "run 2 end")


def test_runs_stop_at_the_limit_and_return_the_last_capture(tmp_path):
    res, runs = stand_in(tmp_path, complete_from=LOST_CAPTURE_RUNS + 1)
    assert runs == LOST_CAPTURE_RUNS
    assert res.stdout.strip() == f"run {LOST_CAPTURE_RUNS}"


def test_a_failed_run_is_returned_as_it_is(tmp_path):
    res, runs = stand_in(tmp_path, complete_from=5, status=3)
    assert (runs, res.returncode) == (1, 3)
