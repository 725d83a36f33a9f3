"""tools/firing-profile.py: the memories it simulates on hand-made firing sequences, and its table
for the shipped model against the float64 reference's own count of active neurons."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest

from convert_helpers import ROOT

SCRIPT = ROOT / "tools" / "firing-profile.py"
MODEL = ROOT / "models" / "spark-shakespeare.npz"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("firing_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lru_keeps_what_was_used_last(tool):
    cycle = [np.array([j]) for j in [0, 1, 2] * 4]
    assert tool.lru_hit_rate(cycle, 2) == 0.0  # a cycle one longer than the memory: all misses
    assert tool.lru_hit_rate(cycle, 3) == pytest.approx(9 / 12)  # the first three miss
    repeat = [np.array([5, 6])] * 4
    assert tool.lru_hit_rate(repeat, 2) == pytest.approx(6 / 8)


def test_pinned_holds_the_first_half_s_hottest(tool):
    # first half: 7 fires every token, 3 once; second half: 7, 3 and 9 once each
    sets = [np.array([7, 3]), np.array([7]), np.array([7]), np.array([3, 9])]
    assert tool.pinned_hit_rate(sets, 10, 1) == pytest.approx(1 / 3)  # 7 only
    assert tool.pinned_hit_rate(sets, 10, 2) == pytest.approx(2 / 3)  # 7 and 3


def test_lru_states_are_the_memory_before_each_token(tool):
    sets = [np.array([0, 1]), np.array([1, 2]), np.array([0])]
    states = list(tool.lru_states(sets, 2))
    assert states == [(frozenset(), 0), (frozenset({0, 1}), 1), (frozenset({1, 2}), 0)]


def test_ahead_scores_count_hidden_and_wasted_reads(tool):
    # F = 6; token 1: active {0, 1, 2}, memory {0}, chosen {1, 4, 5}; token 2: active {3},
    # memory {5}, chosen {3, 5}
    masks = [np.isin(np.arange(6), [1, 4, 5]), np.isin(np.arange(6), [3, 5])]
    active = [np.array([0, 1, 2]), np.array([3])]
    got = tool.ahead_scores(masks, active, [{0}, {5}])
    assert got["recall"] == pytest.approx(2 / 4)  # 1 and 3 of 0, 1, 2, 3
    assert got["chosen"] == pytest.approx(5 / 2)
    assert got["hidden"] == pytest.approx(2 / 3)  # reads 1, 2, 3: 1 and 3 chosen
    assert got["wasted"] == pytest.approx(2 / 2)  # 4 and 5 at token 1; 5 was in memory at 2


def test_chosen_ahead_thresholds_like_the_ffn(tool):
    sys.path.insert(0, str(ROOT / "tests" / "reference"))
    import spark_ref

    rng = np.random.default_rng(7)
    k1 = rng.standard_normal((8, 512))
    inputs = [rng.standard_normal(16) for _ in range(20)]
    for h, mask in zip(inputs, tool.chosen_ahead(inputs, k1, 40)):
        # the neurons the reference's own FFN keeps at k = 40 (a_j != 0), from h's first r_f
        want = spark_ref.soft(h[:8] @ k1, 40) > 0
        assert np.array_equal(mask, want)


def test_the_table_counts_the_neurons_the_reference_activates(tool):
    sys.path.insert(0, str(ROOT / "tests" / "reference"))
    import spark_checkpoint
    import spark_ref

    p = subprocess.run([sys.executable, str(SCRIPT), "--tokens", "60", "--ctx", "31", "--hold",
                        "0.5"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if re.match(r"^\| \d+ \|", line)]
    cfg, weights = spark_checkpoint.load_checkpoint(str(MODEL))
    assert len(rows) == cfg["n_layers"], p.stdout
    # the same windows (BOS + 30 tokens, twice), counted by the reference's own statistics
    bos, ids = tool.tokenize(weights, (ROOT / "models" / "heldout.txt").read_text())
    windows = [[bos] + ids[i:i + 30] for i in (0, 30)]
    keep = np.zeros(cfg["n_layers"])
    for w in windows:
        _, stats = spark_ref.forward(cfg, weights, w, return_stats=True)
        keep += np.asarray(stats["ffn_keep_fraction"]) * len(w)
    per_token = keep * cfg["d_ff"] / sum(len(w) for w in windows)
    for row, want in zip(rows, per_token):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) == pytest.approx(want, abs=0.05), (row, want)
        lru, pinned, uniform = (float(x) for x in re.findall(r"[0-9.]+", cells[4]))
        assert uniform == 50 and 0 <= lru <= 100 and 0 <= pinned <= 100, row
    # the second table: each pair of layers at each default factor (1, 1.5, 2, 3); a larger
    # threshold chooses more and holds at least as many of the next layer's neurons
    ahead = [[c.strip() for c in line.strip("|").split("|")] for line in p.stdout.splitlines()
             if re.match(r"^\| \d+ -> \d+ \|", line)]
    assert len(ahead) == 4 * (cfg["n_layers"] - 1), p.stdout
    for pair in range(cfg["n_layers"] - 1):
        rows = ahead[4 * pair:4 * pair + 4]
        assert [r[0] for r in rows] == [f"{pair} -> {pair + 1}"] * 4, rows
        recall = [float(r[2].rstrip(" %")) for r in rows]
        chosen = [float(r[3].split()[0]) for r in rows]
        assert recall == sorted(recall) and chosen == sorted(chosen), rows
        for c, got in zip((1, 1.5, 2, 3), chosen):
            assert got == pytest.approx(c, rel=0.25), rows  # the statistical top-k's count


def test_bad_arguments_are_named():
    p = subprocess.run([sys.executable, str(SCRIPT), "--hold", "1.5"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--hold in (0, 1)" in p.stderr, p.stderr
    for bad in (["--ahead", "x"], ["--ahead", "0"], ["--ahead-hold", "1"]):
        p = subprocess.run([sys.executable, str(SCRIPT), *bad], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and "--ahead" in p.stderr, (bad, p.stderr)
