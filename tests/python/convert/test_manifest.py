"""`spark-convert --manifest` checked by llama.cpp's own `llama-gguf-hash` (target/upstream/bin,
built by `bash tools/upstream.sh`): the manifest is byte for byte what `llama-gguf-hash --all`
prints for the file, `llama-gguf-hash --check` passes on the file and fails on a copy with 4 KiB
of random bytes written into one tensor's data (found with gguf-py's reader), naming that tensor,
and `spark-gguf validate --manifest` agrees. The tool missing is a failure that says how to build
it, not a skip."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from convert_helpers import ROOT, binary, run_convert
from spark_checkpoint import default_tiny_config, make_checkpoint, save_checkpoint

UPSTREAM_BIN = Path(os.environ.get("SPARK_UPSTREAM_DIR", ROOT / "target" / "upstream")) / "bin"


def gguf_hash(*args, cwd: Path) -> subprocess.CompletedProcess:
    """llama-gguf-hash ARGS, run in `cwd` (its manifest lines name the file as given)."""
    exe = UPSTREAM_BIN / "llama-gguf-hash"
    if not exe.exists():
        pytest.fail(f"{exe} not found: build llama.cpp's tools with `bash tools/upstream.sh`")
    return subprocess.run([str(exe), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def spark_validate(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("spark-gguf")), "validate", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def convert_with_manifest(tmp_path: Path, sp_model: Path, outtype: str) -> Path:
    """A tiny Spark checkpoint converted to out/model.gguf with --manifest; returns out/."""
    ckpt = tmp_path / "ckpt.npz"
    save_checkpoint(str(ckpt), make_checkpoint(default_tiny_config(), seed=5),
                    tokenizer_bytes=sp_model.read_bytes())
    out = tmp_path / "out"
    out.mkdir()
    p = run_convert(ckpt, out / "model.gguf", "--outtype", outtype, "--manifest")
    assert f"wrote {out / 'model.gguf.manifest'}" in p.stdout, p.stdout
    return out


def tensor_lines(stdout: str) -> dict:
    """`--check` output: subject -> result, for the lines of one hash type."""
    result = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[3] == "-":
            result[parts[2]] = parts[4]
    return result


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_manifest_is_what_llama_gguf_hash_prints_and_checks(tmp_path, sp_model, outtype):
    out = convert_with_manifest(tmp_path, sp_model, outtype)
    manifest = (out / "model.gguf.manifest").read_text()
    p = gguf_hash("--all", "model.gguf", cwd=out)
    assert p.returncode == 0, p.stderr
    assert p.stdout == manifest

    n_tensors = len(gguf.GGUFReader(out / "model.gguf").tensors)
    for flag in [[], ["--xxh64"], ["--sha1"], ["--sha256"]]:
        p = gguf_hash("--check", "model.gguf.manifest", *flag, "model.gguf", cwd=out)
        assert p.returncode == 0, p.stdout
        assert p.stdout.rstrip().endswith("Verification results for model.gguf.manifest - Success")
        results = tensor_lines(p.stdout)
        assert len(results) == n_tensors + 1, p.stdout
        assert set(results.values()) == {"Ok"}, p.stdout

    p = spark_validate("--manifest", "model.gguf.manifest", "model.gguf", cwd=out)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"model.gguf: valid ({n_tensors} tensors, "), p.stdout
    assert f"matches model.gguf.manifest ({n_tensors} tensors, {3 * n_tensors + 3} entries" in p.stdout


def test_a_corrupted_copy_fails_the_check_naming_the_tensor(tmp_path, sp_model):
    out = convert_with_manifest(tmp_path, sp_model, "f32")
    reader = gguf.GGUFReader(out / "model.gguf")
    # the first tensor of at least 8 KiB: 4 KiB of random bytes from a quarter into its data
    target = next(t for t in reader.tensors if t.n_bytes >= 8192)
    start = int(target.data_offset) + int(target.n_bytes) // 4
    del reader
    data = bytearray((out / "model.gguf").read_bytes())
    noise = np.random.default_rng(4).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert data[start:start + 4096] != noise
    data[start:start + 4096] = noise
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.gguf").write_bytes(bytes(data))
    shutil.copy(out / "model.gguf.manifest", bad)

    # still a valid GGUF: only the manifest tells
    assert spark_validate("model.gguf", cwd=bad).returncode == 0

    p = gguf_hash("--check", "model.gguf.manifest", "model.gguf", cwd=bad)
    assert p.returncode == 1, p.stdout
    assert p.stdout.rstrip().endswith("Verification results for model.gguf.manifest - Failure")
    results = tensor_lines(p.stdout)
    mismatched = sorted(k for k, v in results.items() if v == "Mismatch")
    assert mismatched == sorted(["model.gguf", f"model.gguf:{target.name}"]), p.stdout
    assert all(v == "Ok" for k, v in results.items() if k not in mismatched), p.stdout

    p = spark_validate("--manifest", "model.gguf.manifest", "model.gguf", cwd=bad)
    assert p.returncode == 1, p.stdout
    assert p.stderr.startswith(
        f"spark-gguf: tensor '{target.name}' of model.gguf does not match model.gguf.manifest: "
    ), p.stderr


def test_manifest_paths_and_refusals(tmp_path, sp_model):
    ckpt = tmp_path / "ckpt.npz"
    save_checkpoint(str(ckpt), make_checkpoint(default_tiny_config(), seed=6),
                    tokenizer_bytes=sp_model.read_bytes())
    out = tmp_path / "out"
    out.mkdir()
    sums = tmp_path / "sums"
    sums.mkdir()

    # --manifest=FILE puts it elsewhere; its lines name the output by its file name
    run_convert(ckpt, out / "m.gguf", f"--manifest={sums / 'm.txt'}", "-q")
    assert sorted(os.listdir(out)) == ["m.gguf"]
    text = (sums / "m.txt").read_text()
    assert text.splitlines()[-1].endswith("  m.gguf")
    p = spark_validate("--manifest", sums / "m.txt", out / "m.gguf", cwd=tmp_path)
    assert p.returncode == 0, p.stderr

    # an existing manifest is refused without --force, before anything is written
    p = run_convert(ckpt, out / "n.gguf", f"--manifest={sums / 'm.txt'}", check=False)
    assert p.returncode != 0 and "m.txt: output file exists (pass --force" in p.stderr, p.stderr
    assert sorted(os.listdir(out)) == ["m.gguf"]
    assert (sums / "m.txt").read_text() == text
    run_convert(ckpt, out / "n.gguf", f"--manifest={sums / 'm.txt'}", "--force", "-q")
    assert (sums / "m.txt").read_text().splitlines()[-1].endswith("  n.gguf")

    # a file name a manifest line cannot hold: nothing is written
    p = run_convert(ckpt, out / "my model.gguf", "--manifest", check=False)
    assert p.returncode != 0 and '"my model.gguf" cannot stand in' in p.stderr, p.stderr
    assert "panicked" not in p.stderr
    assert sorted(os.listdir(out)) == ["m.gguf", "n.gguf"]

    # a conversion that fails while writing (a deflated entry corrupt in its middle, found
    # after earlier tensors are written) leaves neither the output nor the manifest
    deflated = tmp_path / "deflated.npz"
    save_checkpoint(str(deflated), make_checkpoint(default_tiny_config(), seed=7), compressed=True,
                    tokenizer_bytes=sp_model.read_bytes())
    with zipfile.ZipFile(deflated) as z:
        member = max((i for i in z.infolist() if i.filename != "tokenizer"),
                     key=lambda i: i.compress_size)
    data = bytearray(deflated.read_bytes())
    local = member.header_offset
    name_len, extra_len = struct.unpack("<HH", data[local + 26:local + 30])
    middle = local + 30 + name_len + extra_len + member.compress_size // 2
    data[middle:middle + 64] = bytes(64)
    deflated.write_bytes(bytes(data))
    p = run_convert(deflated, out / "b.gguf", "--manifest", check=False)
    assert p.returncode != 0 and "panicked" not in p.stderr, p.stderr
    assert member.filename.removesuffix(".npy") in p.stderr, p.stderr
    assert sorted(os.listdir(out)) == ["m.gguf", "n.gguf"]
