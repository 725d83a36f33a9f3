"""Helpers for the spark-convert end-to-end tests (imported by test_convert.py).

The binaries (spark-convert, spark-gguf) are found in $SPARK_BIN_DIR (default: target/debug of
the workspace). Checkpoints come from tests/reference/spark_checkpoint.py, written independently
of the Rust code from SPEC.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "reference"))

BIN_DIR = Path(os.environ.get("SPARK_BIN_DIR", ROOT / "target" / "debug"))


def binary(name: str) -> Path:
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{path} not found: build the workspace (cargo build) or set SPARK_BIN_DIR")
    return path


def run_convert(*args, check: bool = True, env=None) -> subprocess.CompletedProcess:
    """Run spark-convert with `args`; `check` asserts exit status 0."""
    p = subprocess.run([str(binary("spark-convert")), *map(str, args)], capture_output=True, text=True,
                       timeout=120, env=env)
    if check:
        assert p.returncode == 0, f"spark-convert {args} failed:\n{p.stderr}"
    return p


def validate(path: Path) -> None:
    """Assert `spark-gguf validate` accepts the file."""
    p = subprocess.run([str(binary("spark-gguf")), "validate", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, f"spark-gguf validate {path}:\n{p.stdout}\n{p.stderr}"


def tiny_q8_0_pair(directory: Path) -> tuple[Path, Path]:
    """The `tiny` (spark-gemma2) and `tiny-dense` (gemma2) synthetic presets in q8_0, written
    into `directory`: (spark, stock)."""
    for preset in ("tiny", "tiny-dense"):
        run_convert("--synthetic", preset, directory / f"{preset}.gguf", "--outtype", "q8_0",
                    "--quiet")
    return directory / "tiny.gguf", directory / "tiny-dense.gguf"
