"""Shared fixtures: binaries, tiny random checkpoints, their GGUF conversions and the float64
reference logits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "reference"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spark_checkpoint  # noqa: E402
import spark_ref  # noqa: E402

BIN_DIR = Path(os.environ.get("SPARK_BIN_DIR", ROOT / "target" / "debug"))

# attention sparsity and the sliding window both engage: T = 80 >= 4 * attn_k (8 -> 32) and the
# window (24) is shorter than the prompt; 4 layers alternate sliding (even) and global (odd)
TINY = dict(n_layers=4, sliding_window=24, attn_k=8, ffn_k=20)
N_TOKENS = 80


def binary(name: str) -> Path:
    path = BIN_DIR / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it first (cargo build) or set SPARK_BIN_DIR")
    return path


def run(args, check=True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def spark(*args, check=True) -> subprocess.CompletedProcess:
    return run([binary("spark"), *args], check=check)


def vocab_gguf(tmp: Path) -> Path:
    """A GGUF whose tokenizer.* keys (512 pieces: Gemma's specials, bytes, fillers) the test
    checkpoints borrow: spark-convert's own synthetic tiny preset."""
    path = tmp / "vocab512.gguf"
    if not path.exists():
        run([binary("spark-convert"), "--synthetic", "tiny", path, "--quiet"])
    return path


def convert(npz: Path, out: Path, outtype: str = "f32") -> Path:
    run([binary("spark-convert"), npz, out, "--outtype", outtype, "--vocab-from", vocab_gguf(out.parent), "--quiet"])
    return out


def eval_logits(model: Path, tokens, out: Path, *flags) -> np.ndarray:
    spark("eval", "-m", model, "--tokens", ",".join(map(str, tokens)), "--logits-out", out,
          "--quiet", *flags)
    return np.load(out)


def compare(logits: np.ndarray, ref: np.ndarray) -> dict:
    """Per-position relative L2 error and top-1 agreement."""
    assert logits.shape == ref.shape, (logits.shape, ref.shape)
    assert np.isfinite(logits).all()
    rel = np.linalg.norm(logits - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return {
        "median": float(np.median(rel)),
        "p90": float(np.quantile(rel, 0.9)),
        "top1": float(np.mean(np.argmax(logits, axis=1) == np.argmax(ref, axis=1))),
    }


class TinyModel:
    """A random checkpoint, its f32 GGUF and reference logits on a fixed token sequence."""

    def __init__(self, tmp: Path, seed: int, dense: bool = False, **overrides):
        self.config = spark_checkpoint.default_tiny_config(**{**TINY, **overrides})
        arrays = spark_checkpoint.make_checkpoint(self.config, seed=seed, dense=dense)
        self.npz = tmp / f"tiny{seed}{'-dense' if dense else ''}.npz"
        spark_checkpoint.save_checkpoint(str(self.npz), arrays, dtype="float32")
        _, self.weights = spark_checkpoint.load_checkpoint(str(self.npz))
        self.gguf = convert(self.npz, tmp / f"tiny{seed}{'-dense' if dense else ''}.gguf")
        rng = np.random.default_rng(seed + 100)
        self.tokens = [int(t) for t in rng.integers(4, self.config["vocab_size"], N_TOKENS)]
        self.ref, self.ref_stats = spark_ref.forward(self.config, self.weights, self.tokens, return_stats=True)


@pytest.fixture(scope="session")
def tmp_models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny(tmp_models) -> TinyModel:
    return TinyModel(tmp_models, seed=1)
