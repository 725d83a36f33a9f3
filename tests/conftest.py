"""Shared pytest setup: makes the float64 reference importable from every test directory
(`import spark_ref`, `import spark_checkpoint`) and exposes where the built binaries are."""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "reference"))


@pytest.fixture(scope="session")
def bin_dir() -> pathlib.Path:
    """Directory holding spark, spark-convert and spark-gguf (env SPARK_BIN_DIR)."""
    return pathlib.Path(os.environ.get("SPARK_BIN_DIR", ROOT / "target" / "debug"))
