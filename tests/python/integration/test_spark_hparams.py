"""The patched llama.cpp loader refuses Spark hyper-parameters outside SPEC section 2's ranges.

A valid tiny spark-gemma2 GGUF (spark-convert's synthetic `tiny` preset) is copied and one
`spark.*` key is rewritten in place with gguf-py; `spark eval` must then fail with one error line
that names the full key, without a panic or an abort, and write no logits."""

from __future__ import annotations

import re

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader  # type: ignore

from conftest import binary, run, spark

ARCH = "spark-gemma2"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hparams") / "tiny.gguf"
    run([binary("spark-convert"), "--synthetic", "tiny", path, "--outtype", "f32", "--quiet"])
    return path


def u32(path: Path, key: str) -> int:
    field = GGUFReader(path).fields[f"{ARCH}.{key}"]
    return int(field.parts[field.data[0]][0])


def with_key(src: Path, dst: Path, key: str, value: int) -> Path:
    """A copy of `src` whose u32 key `{ARCH}.{key}` holds `value` (rewritten in place by gguf-py)."""
    shutil.copyfile(src, dst)
    reader = GGUFReader(dst, "r+")
    field = reader.fields[f"{ARCH}.{key}"]
    assert field.parts[field.data[0]].dtype == np.uint32
    field.parts[field.data[0]][0] = value
    reader.data.flush()
    del reader
    assert u32(dst, key) == value
    return dst


def bad_values(model: Path) -> list[tuple[str, int, str]]:
    """(key, value, why) for every out-of-range case, from the file's own D, F and H."""
    d, h = u32(model, "embedding_length"), u32(model, "attention.key_length")
    r_a = u32(model, "spark.attn_r")
    assert h % 2 == 0 and r_a % 2 == 0
    return [
        ("spark.ffn_k", 0, "k_f = 0"),
        ("spark.attn_k", 0, "k_a = 0"),
        ("spark.ffn_r", 0, "r_f = 0"),
        ("spark.ffn_r", d, "r_f = D"),
        ("spark.ffn_r", d + 8, "r_f > D"),
        ("spark.attn_r", 0, "r_a = 0"),
        ("spark.attn_r", r_a + 1, "odd r_a"),
        ("spark.attn_r", h, "r_a = H"),
        ("spark.attn_r", h + 2, "r_a > H"),
    ]


def test_out_of_range_spark_hparams_are_refused(tiny_gguf, tmp_path):
    baseline = spark("eval", "-m", tiny_gguf, "--tokens", "1,2,3", "--logits-out", tmp_path / "ok.npy", "--quiet")
    assert baseline.returncode == 0 and (tmp_path / "ok.npy").exists()
    for i, (key, value, why) in enumerate(bad_values(tiny_gguf)):
        model = with_key(tiny_gguf, tmp_path / f"bad{i}.gguf", key, value)
        out = tmp_path / f"bad{i}.npy"
        proc = spark("eval", "-m", model, "--tokens", "1,2,3", "--logits-out", out, check=False)
        # an error exit of our own: not a signal (abort), not a Rust panic (101)
        assert proc.returncode == 1, (why, proc.returncode, proc.stderr)
        for marker in ("panicked", "backtrace", "terminate called", "GGML_ASSERT"):
            assert marker not in proc.stderr, (why, proc.stderr)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        assert len(lines) == 1, (why, proc.stderr)
        assert lines[0].startswith("spark: error: "), (why, lines[0])
        # spark-gguf's schema refuses the file before llama.cpp loads it (whose loader has the
        # same rules for what it can check: "invalid {ARCH}.{key}: {value}, ..."), naming the
        # key and the value
        assert f"metadata key '{ARCH}.{key}'" in lines[0], (why, lines[0])
        assert re.search(rf"\b{value}\b", lines[0].split(f"'{ARCH}.{key}'", 1)[1]), (why, lines[0])
        assert str(model) in lines[0], (why, lines[0])
        assert not out.exists(), why


def test_ffn_k_above_F_is_the_dense_ffn_not_an_error(tiny_gguf, tmp_path):
    # SPEC section 1: k >= d means no sparsification, so k_f > F is in range and acts as k_f = F
    f = u32(tiny_gguf, "feed_forward_length")
    tokens = "1,2,3,4,5,6,7,8"
    logits = {}
    for k in (f, f + 1, 10 * f):
        model = with_key(tiny_gguf, tmp_path / f"k{k}.gguf", "spark.ffn_k", k)
        for flags in ((), ("--dense",)):
            out = tmp_path / f"k{k}{''.join(flags)}.npy"
            spark("eval", "-m", model, "--tokens", tokens, "--logits-out", out, "--quiet", *flags)
            logits[k, flags] = np.load(out)
    for flags in ((), ("--dense",)):
        assert np.isfinite(logits[f, flags]).all()
        assert np.array_equal(logits[f, flags], logits[f + 1, flags]), flags
        assert np.array_equal(logits[f, flags], logits[10 * f, flags]), flags
    default = tmp_path / "default.npy"
    spark("eval", "-m", tiny_gguf, "--tokens", tokens, "--logits-out", default, "--quiet")
    assert not np.allclose(np.load(default), logits[f, ()]), "k_f = F should change the model"
