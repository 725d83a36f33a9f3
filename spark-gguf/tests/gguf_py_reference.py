"""Reference side of spark-gguf's cross-checks against gguf-py (PyPI `gguf`).

Run by tests/gguf_py.rs with the interpreter named by SPARK_PYTHON:

  quant IN.f32 OUTDIR   encode the little-endian f32 values in IN.f32 with gguf.quants as
                        F16, BF16, Q8_0 and Q4_0; write OUTDIR/<type>.bin (raw bytes) and
                        OUTDIR/<type>.dec.f32 (gguf-py's dequantization of those bytes)
  read FILE OUT.json    read FILE with gguf.GGUFReader and dump every field (types and values,
                        floats as IEEE bit patterns) and every tensor (type, shape, raw bytes
                        as hex, dequantized values as f32 bit patterns) as JSON
  types OUT.json        dump every gguf.GGMLQuantizationType (name, id) with its
                        gguf.constants.GGML_QUANT_SIZES entry (block size, type size; null if
                        gguf-py has none) as JSON
"""
import json
import sys

import numpy as np
import gguf
from gguf.quants import dequantize, quantize

QUANT_TYPES = {
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
}

FLOAT_BITS = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def quant(inp, outdir):
    x = np.fromfile(inp, dtype="<f4")
    for name, qtype in QUANT_TYPES.items():
        # One row of 64 values per line, as the converter quantizes row by row.
        rows = x.reshape(-1, 64)
        with np.errstate(all="ignore"):
            q = quantize(rows, qtype)
            d = dequantize(q, qtype)
        np.ascontiguousarray(q).view(np.uint8).tofile(f"{outdir}/{name}.bin")
        np.ascontiguousarray(d, dtype="<f4").tofile(f"{outdir}/{name}.dec.f32")


def plain(arr):
    """A numpy array as JSON-exact values: floats by bit pattern, bools as 0/1."""
    arr = np.asarray(arr)
    if arr.dtype in FLOAT_BITS:
        return arr.view(FLOAT_BITS[arr.dtype]).tolist()
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8).tolist()
    return arr.tolist()


def read(path, out):
    r = gguf.GGUFReader(path)
    fields = []
    for f in r.fields.values():
        types = [int(t) for t in f.types]
        if f.name.startswith("GGUF."):
            continue  # header pseudo-fields
        if types[-1] == int(gguf.GGUFValueType.STRING):
            values = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        else:
            values = [v for i in f.data for v in plain(f.parts[i])]
        fields.append({"key": f.name, "types": types, "values": values})
    tensors = []
    for t in r.tensors:
        raw = np.ascontiguousarray(t.data).view(np.uint8).tobytes()
        entry = {
            "name": t.name,
            "type": int(t.tensor_type),
            "shape": [int(s) for s in t.shape],
            "n_bytes": int(t.n_bytes),
            "data_offset": int(t.data_offset),
            "hex": raw.hex(),
        }
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, *QUANT_TYPES.values()):
            deq = dequantize(t.data, t.tensor_type)
            entry["f32_bits"] = plain(np.ascontiguousarray(deq, dtype="<f4").ravel())
        tensors.append(entry)
    with open(out, "w") as fh:
        json.dump({"alignment": int(r.alignment), "fields": fields, "tensors": tensors}, fh)


def types(out):
    from gguf.constants import GGML_QUANT_SIZES

    entries = []
    for t in gguf.GGMLQuantizationType:
        sizes = GGML_QUANT_SIZES.get(t)
        entries.append(
            {
                "name": t.name,
                "id": int(t),
                "block_size": None if sizes is None else int(sizes[0]),
                "type_size": None if sizes is None else int(sizes[1]),
            }
        )
    with open(out, "w") as fh:
        json.dump({"gguf_version": gguf_version(), "types": entries}, fh)


def gguf_version():
    try:
        from importlib.metadata import version

        return version("gguf")
    except Exception:  # not installed as a distribution (e.g. a source checkout on PYTHONPATH)
        return "unknown"


if __name__ == "__main__":
    if sys.argv[1] == "quant":
        quant(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "types":
        types(sys.argv[2])
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
