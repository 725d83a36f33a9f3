"""`spark-gguf` (inspect, validate) on files written independently by gguf-py's GGUFWriter.

The Rust tests check that gguf-py reads what spark-gguf writes; these check the other direction:
spark-gguf reads gguf-py's files with the same keys and types, accepts a Spark-Gemma2 model
written from SPEC alone (tests/python/integration/gguf_writer_ref.py), and names what is wrong
in broken ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType
from gguf import quants as gguf_quants

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "reference"))
sys.path.insert(0, str(ROOT / "tests" / "python" / "integration"))

import spark_checkpoint  # noqa: E402
from gguf_writer_ref import write_spark_gguf  # noqa: E402

BIN_DIR = Path(os.environ.get("SPARK_BIN_DIR", ROOT / "target" / "debug"))


def spark_gguf(*args) -> subprocess.CompletedProcess:
    exe = BIN_DIR / "spark-gguf"
    if not exe.exists():
        pytest.fail(f"{exe} not found: build the workspace (cargo build) or set SPARK_BIN_DIR")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def tiny_weights():
    cfg = spark_checkpoint.default_tiny_config()
    arrays = spark_checkpoint.make_checkpoint(cfg, seed=3)
    weights = {k: v for k, v in arrays.items() if k != "config"}
    return cfg, weights


def test_inspect_reads_every_value_type(tmp_path):
    path = tmp_path / "types.gguf"
    g = GGUFWriter(str(path), "test")
    scalars = [
        ("v.u8", 200, GGUFValueType.UINT8, "u8", "200"),
        ("v.i8", -5, GGUFValueType.INT8, "i8", "-5"),
        ("v.u16", 60000, GGUFValueType.UINT16, "u16", "60000"),
        ("v.i16", -300, GGUFValueType.INT16, "i16", "-300"),
        ("v.u32", 4000000000, GGUFValueType.UINT32, "u32", "4000000000"),
        ("v.i32", -7, GGUFValueType.INT32, "i32", "-7"),
        ("v.f32", 0.5, GGUFValueType.FLOAT32, "f32", "0.5"),
        ("v.bool", True, GGUFValueType.BOOL, "bool", "true"),
        ("v.str", "h\u00e9llo", GGUFValueType.STRING, "str", '"h\u00e9llo"'),
        ("v.u64", 2**63, GGUFValueType.UINT64, "u64", str(2**63)),
        ("v.i64", -(2**40), GGUFValueType.INT64, "i64", str(-(2**40))),
        ("v.f64", 0.25, GGUFValueType.FLOAT64, "f64", "0.25"),
    ]
    for key, val, vt, _, _ in scalars:
        g.add_key_value(key, val, vt)
    g.add_key_value("a.u32", list(range(20)), GGUFValueType.ARRAY, GGUFValueType.UINT32)
    g.add_key_value("a.str", ["x", "y"], GGUFValueType.ARRAY, GGUFValueType.STRING)
    g.add_tensor("t.f32", np.arange(15, dtype=np.float32).reshape(5, 3))
    g.add_tensor("t.f16", np.ones((2, 7), dtype=np.float16))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()

    p = spark_gguf("inspect", path)
    assert p.returncode == 0, p.stderr
    for key, _, _, tname, shown in scalars:
        assert f"  {key} [{tname}] = {shown}\n" in p.stdout, (key, p.stdout)
    assert "  a.u32 [arr[u32]] = [0, 1, 2, 3, 4, 5, 6, 7, ...] (20 elements)\n" in p.stdout
    assert '  a.str [arr[str]] = ["x", "y"]\n' in p.stdout
    assert "  t.f32 f32 [3, 5] 60 bytes\n" in p.stdout
    assert "  t.f16 f16 [7, 2] 28 bytes\n" in p.stdout
    assert p.stdout.startswith("version: 3\nalignment: 32\n")


def test_validate_accepts_spec_model_written_by_gguf_py(tmp_path, tiny_weights):
    cfg, w = tiny_weights
    path = tmp_path / "spark.gguf"
    write_spark_gguf(str(path), cfg, w)
    p = spark_gguf("validate", path)
    assert p.returncode == 0, p.stdout + p.stderr
    n_tensors = 2 + 11 * cfg["n_layers"]
    assert p.stdout.startswith(f"{path}: valid ({n_tensors} tensors, ")


def test_validate_names_missing_tensor(tmp_path, tiny_weights):
    cfg, w = tiny_weights
    path = tmp_path / "missing.gguf"
    write_spark_gguf(str(path), cfg, w, skip_tensors={"blk.1.ffn_down_t.weight"})
    p = spark_gguf("validate", path)
    assert p.returncode == 1
    d, f = cfg["d_model"], cfg["d_ff"]
    assert p.stdout == f"{path}: blk.1.ffn_down_t.weight: is missing (expected shape [{d}, {f}])\n"


def test_validate_names_mistyped_key(tmp_path, tiny_weights):
    cfg, w = tiny_weights
    path = tmp_path / "float_key.gguf"
    write_spark_gguf(str(path), cfg, w, float_keys={"spark.ffn_k"})
    p = spark_gguf("validate", path)
    assert p.returncode == 1
    assert p.stdout == f"{path}: spark-gemma2.spark.ffn_k: must have type u32 but has type f32\n"


def test_quantized_tensor_needs_quantization_version(tmp_path):
    path = tmp_path / "q.gguf"
    g = GGUFWriter(str(path), "test")
    raw = np.zeros((2, 34), dtype=np.uint8)  # two Q8_0 blocks: ne [32, 2]
    g.add_tensor("q", raw, raw_dtype=GGMLQuantizationType.Q8_0)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    p = spark_gguf("validate", path)
    assert p.returncode == 1
    assert f"{path}: general.quantization_version: is missing but tensor 'q' is quantized\n" in p.stdout


def test_unreadable_file_is_one_clear_line(tmp_path):
    path = tmp_path / "trunc.gguf"
    g = GGUFWriter(str(path), "test")
    g.add_tensor("t", np.ones(64, dtype=np.float32))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    p = spark_gguf("validate", path)
    assert p.returncode != 0
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1
    assert "extends beyond the end of the" in p.stderr


def write_paired(src: Path, dst: Path, k2v_type: GGMLQuantizationType) -> None:
    """Rewrites the Spark model at `src` (gguf-py's, all f32) with each layer's ffn_up (K2) and
    ffn_down_t (V) as one tensor, ffn_k2v, in ffn_up's place: row j = K2's row j then V's row j
    (SPEC section 3), stored as `k2v_type` by gguf-py."""
    r = GGUFReader(src)
    g = GGUFWriter(str(dst), "spark-gemma2")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
        g.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    g.add_uint32("general.quantization_version", 2)
    t = {x.name: x for x in r.tensors}
    for x in r.tensors:
        if x.name.endswith(".ffn_down_t.weight"):
            continue
        data = np.asarray(x.data)
        if x.name.endswith(".ffn_up.weight"):
            v = np.asarray(t[x.name.replace(".ffn_up.", ".ffn_down_t.")].data)
            k2v = np.concatenate([data, v], axis=1)
            if k2v_type == GGMLQuantizationType.F32:
                g.add_tensor(x.name.replace(".ffn_up.", ".ffn_k2v."), k2v)
            else:
                raw = gguf_quants.quantize(k2v, k2v_type)
                g.add_tensor(x.name.replace(".ffn_up.", ".ffn_k2v."), raw, raw_shape=raw.shape,
                             raw_dtype=k2v_type)
        else:
            g.add_tensor(x.name, data)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


@pytest.mark.parametrize("k2v_type", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0])
def test_validate_accepts_k2_and_v_paired_by_gguf_py(tmp_path, tiny_weights, k2v_type):
    cfg, w = tiny_weights  # D 64, r_f 32: both parts of a row whole q8_0 blocks
    src, path = tmp_path / "spark.gguf", tmp_path / "paired.gguf"
    write_spark_gguf(str(src), cfg, w)
    write_paired(src, path, k2v_type)
    p = spark_gguf("validate", path)
    assert p.returncode == 0, p.stdout + p.stderr
    n_tensors = 2 + 10 * cfg["n_layers"]
    assert p.stdout.startswith(f"{path}: valid ({n_tensors} tensors, "), p.stdout
    assert p.stdout.rstrip().endswith(", ffn_k2v paired)"), p.stdout
    d, rf, f = cfg["d_model"], cfg["ffn_r"], cfg["d_ff"]
    p = spark_gguf("inspect", path)
    assert f"  blk.1.ffn_k2v.weight {k2v_type.name.lower()} [{d - rf + d}, {f}] " in p.stdout, p.stdout


def test_validate_names_a_paired_type_that_splits_the_parts(tmp_path):
    # D 48, r_f 32: a row of 16 + 48 = 64 values is two whole q8_0 blocks, but K2's part ends in
    # the middle of the first
    cfg = spark_checkpoint.default_tiny_config(d_model=48, ffn_r=32, n_layers=1)
    w = {k: v for k, v in spark_checkpoint.make_checkpoint(cfg, seed=3).items() if k != "config"}
    src, path = tmp_path / "spark.gguf", tmp_path / "paired.gguf"
    write_spark_gguf(str(src), cfg, w)
    write_paired(src, path, GGMLQuantizationType.Q8_0)
    p = spark_gguf("validate", path)
    assert p.returncode == 1
    assert p.stdout == (f"{path}: blk.0.ffn_k2v.weight: type q8_0 (blocks of 32 elements) does not make each "
                        "part of a row whole blocks: ffn_up part 16, ffn_down_t part 48 elements\n")
    write_paired(src, path, GGMLQuantizationType.F32)
    assert spark_gguf("validate", path).returncode == 0


def test_validate_refuses_a_mix_of_paired_and_separate_layers(tmp_path, tiny_weights):
    cfg, w = tiny_weights
    src, path = tmp_path / "spark.gguf", tmp_path / "paired.gguf"
    write_spark_gguf(str(src), cfg, w)
    write_paired(src, path, GGMLQuantizationType.F32)
    # layer 0 paired, layer 1 separate: the paired file without blk.1.ffn_k2v, with blk.1's
    # ffn_up and ffn_down_t
    mixed = tmp_path / "mixed.gguf"
    rp, rs = GGUFReader(path), GGUFReader(src)
    g = GGUFWriter(str(mixed), "spark-gemma2")
    for f in rp.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
        g.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for x in rp.tensors:
        if x.name != "blk.1.ffn_k2v.weight":
            g.add_tensor(x.name, np.asarray(x.data))
    for x in rs.tensors:
        if x.name in ("blk.1.ffn_up.weight", "blk.1.ffn_down_t.weight"):
            g.add_tensor(x.name, np.asarray(x.data))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    p = spark_gguf("validate", mixed)
    assert p.returncode == 1
    d, rf, f = cfg["d_model"], cfg["ffn_r"], cfg["d_ff"]
    assert p.stdout == (
        f"{mixed}: blk.1.ffn_k2v.weight: is missing (expected shape [{d - rf + d}, {f}])\n"
        f"{mixed}: blk.1.ffn_up.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)\n"
        f"{mixed}: blk.1.ffn_down_t.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)\n")
