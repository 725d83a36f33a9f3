"""Fixtures of the Gemma 3n tests: the tiny Gemma 3n of tools/gemma3n-synth.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# The helpers as module `gemma3n_helpers` (the tests run with --import-mode=importlib, which puts
# no test directory on sys.path), registered by file as tests/python/upstream/conftest.py does.
_spec = importlib.util.spec_from_file_location(
    "gemma3n_helpers", Path(__file__).resolve().with_name("gemma3n_helpers.py"))
gemma3n_helpers = importlib.util.module_from_spec(_spec)
sys.modules["gemma3n_helpers"] = gemma3n_helpers
_spec.loader.exec_module(gemma3n_helpers)

from gemma3n_helpers import synth  # noqa: E402

TINY_OUTTYPES = ("f32", "q8_0", "bf16")


def synth_all_types(tmp_path_factory, preset: str) -> dict[str, Path]:
    """outtype -> `preset` (seed 1) in that type, written once into a new folder."""
    d = tmp_path_factory.mktemp(f"gemma3n-{preset}")
    out = {}
    for t in TINY_OUTTYPES:
        out[t] = d / f"gemma3n-{preset}-{t}.gguf"
        synth(preset, out[t], "--outtype", t, "--seed", 1, "--quiet")
    return out


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """outtype -> the tiny Gemma 3n (seed 1) in that type."""
    return synth_all_types(tmp_path_factory, "tiny")


@pytest.fixture(scope="session")
def calm(tmp_path_factory) -> dict[str, Path]:
    """outtype -> the tiny-calm Gemma 3n (seed 1): tiny's shapes, layers that add a tenth as
    much to the residual stream, so that distances measure computations, not chaos."""
    return synth_all_types(tmp_path_factory, "tiny-calm")


@pytest.fixture(scope="session")
def tiny_meta(tiny) -> dict:
    """The tiny model's shapes, read back from its file."""
    import gguf
    r = gguf.GGUFReader(tiny["f32"])
    gate = next(t for t in r.tensors if t.name == "blk.0.ffn_gate.weight")  # ggml [n_embd, n_ff]
    return {"n_layer": int(r.get_field("gemma3n.block_count").contents()),
            "n_embd": int(gate.shape[0]), "n_ff": int(gate.shape[1])}
