"""tools/memory-budget.py: the memory budget of tools/bench-memory.sh (docs/PERF.md, "Models
larger than memory"). --sizes against bytes counted by hand from docs/SPEC.md section 3 for the
`tiny` / `tiny-dense` presets in q8_0 (as tests/python/convert/test_predict_ratio.py counts them);
--leave holds memory away from a command (seen in the command's own MemAvailable) and passes its
exit status on; refusals name what they refuse."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gguf

from convert_helpers import ROOT, run_convert, tiny_q8_0_pair

SCRIPT = ROOT / "tools" / "memory-budget.py"
D, L, F, R_F = 128, 2, 512, 64  # converter/src/synthetic.rs, tiny


def q8(n: int) -> int:
    return n * 34 // 32


def budget(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def sizes(path) -> dict[str, float]:
    p = budget("--sizes", path)
    assert p.returncode == 0, p.stderr
    return {k: float(v) for k, v in (line.split() for line in p.stdout.splitlines())}


def mem_available_gb() -> float:
    line = next(l for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
    return int(line.split()[1]) * 1024 / 1e9


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_q8_0_pair(tmp_path_factory.mktemp("budget"))


def test_sizes_split_a_spark_file_into_always_read_and_rows(pair):
    spark, stock = pair
    total = sum(int(t.n_bytes) for t in gguf.GGUFReader(spark).tensors) / 1e9
    rows = L * (q8((D - R_F) * F) + q8(D * F)) / 1e9  # K2 (ffn_up) and V (ffn_down_t)
    s = sizes(spark)
    assert s["rows"] == pytest.approx(rows, abs=1e-6), s
    assert s["total"] == pytest.approx(total, abs=1e-6) and \
        s["always"] == pytest.approx(total - rows, abs=2e-6), s
    d = sizes(stock)  # stock gemma2: every byte is read per token
    assert d["rows"] == 0 and d["always"] == d["total"] > 0, d


def test_sizes_count_paired_k2_and_v_as_rows(pair, tmp_path):
    """The same model with K2 and V side by side (--pair-k2v: one ffn_k2v per layer): the same
    split, byte for byte."""
    paired = tmp_path / "tiny-paired.gguf"
    run_convert("--synthetic", "tiny", paired, "--outtype", "q8_0", "--pair-k2v", "--quiet")
    assert any(t.name.endswith(".ffn_k2v.weight") for t in gguf.GGUFReader(paired).tensors)
    assert sizes(paired) == sizes(pair[0])


def test_a_command_runs_with_the_memory_left_and_keeps_its_exit_status():
    before = mem_available_gb()
    leave = before - 0.4  # hold ~0.4 GB away
    p = budget("--leave", f"{leave:.3f}", "--", "sh", "-c",
               "grep MemAvailable /proc/meminfo; exit 3")
    assert p.returncode == 3, p.stderr
    seen = int(p.stdout.split()[1]) * 1024 / 1e9
    # what the command saw: about what was left (other processes move MemAvailable a little)
    assert seen <= before - 0.2, (before, seen, p.stderr)
    assert "holding" in p.stderr and "GB" in p.stderr, p.stderr


def test_refusals_name_what_they_refuse(tmp_path):
    p = budget("--leave", "100000", "--", "true")
    assert p.returncode == 1 and "--leave 100000 GB: only" in p.stderr, p.stderr
    p = budget("--leave", "1")
    assert p.returncode == 2 and "command" in p.stderr, p.stderr
    missing = tmp_path / "nope.gguf"
    p = budget("--evict", missing)
    assert p.returncode == 1 and str(missing) in p.stderr, p.stderr
    p = budget("--sizes", missing)
    assert p.returncode == 1 and str(missing) in p.stderr, p.stderr
    p = budget("--leave", "0.5", "--", str(tmp_path / "no-such-program"))  # before holding
    assert p.returncode == 1 and "no-such-program" in p.stderr, p.stderr


def test_evict_alone_drops_a_file_from_the_page_cache(pair):
    p = budget("--evict", pair[0])
    assert p.returncode == 0 and p.stdout == "", (p.stdout, p.stderr)
