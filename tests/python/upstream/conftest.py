"""Fixtures of the upstream-tool tests (models, servers); the helpers are in upstream_helpers.py,
importable from the test modules."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

# The helpers as module `upstream_helpers`, registered by name rather than by putting this
# directory on sys.path (other test directories import their own `conftest` from sys.path).
_spec = importlib.util.spec_from_file_location(
    "upstream_helpers", Path(__file__).resolve().with_name("upstream_helpers.py"))
upstream_helpers = importlib.util.module_from_spec(_spec)
sys.modules["upstream_helpers"] = upstream_helpers
_spec.loader.exec_module(upstream_helpers)

from upstream_helpers import (  # noqa: E402
    GEMMA2_CHAT_TEMPLATE, MODEL_NPZ, OUT_DIR, Server, llama_quantize, run, spark_binary)


@pytest.fixture
def server_factory(tmp_path_factory):
    """Starts servers (Server(...) arguments); each is killed at the end of the test if it is
    still running."""
    started = []
    workdir = tmp_path_factory.mktemp("server")

    def start(model, *extra, **kw) -> Server:
        srv = Server(model, workdir, *extra, **kw)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.kill()


# ---------------------------------------------------------------------------------------------
# models


@pytest.fixture(scope="session")
def upstream_models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("upstream-models")


@pytest.fixture(scope="session")
def shipped_f32(upstream_models) -> Path:
    """models/spark-shakespeare.npz converted to an f32 GGUF (as tests/python/model does)."""
    out = upstream_models / "spark-shakespeare-f32.gguf"
    run([spark_binary("spark-convert"), MODEL_NPZ, out, "--outtype", "f32", "--quiet"])
    return out


@pytest.fixture(scope="session")
def shipped_f32_paired(upstream_models) -> Path:
    """The shipped model as shipped_f32 with each neuron's K2 and V rows side by side
    (spark-convert --pair-k2v: one ffn_k2v tensor per layer)."""
    out = upstream_models / "spark-shakespeare-f32-paired.gguf"
    run([spark_binary("spark-convert"), MODEL_NPZ, out, "--outtype", "f32", "--quiet", "--pair-k2v"])
    return out


@pytest.fixture(scope="session")
def shipped_f32_chat(upstream_models) -> Path:
    """The shipped model as shipped_f32, with Gemma-2's chat template in the file
    (tokenizer.chat_template = GEMMA2_CHAT_TEMPLATE): what a chat client finds in a real model."""
    template = upstream_models / "gemma2-chat-template.jinja"
    template.write_text(GEMMA2_CHAT_TEMPLATE)
    out = upstream_models / "spark-shakespeare-f32-chat.gguf"
    run([spark_binary("spark-convert"), MODEL_NPZ, out, "--outtype", "f32", "--quiet",
         "--chat-template", f"@{template}"])
    return out


@pytest.fixture(scope="session")
def shipped_quantized(upstream_models, shipped_f32):
    """{qtype: path} of llama-quantize's quantizations of the shipped model, made on demand."""
    made = {}

    def get(qtype: str) -> Path:
        if qtype not in made:
            out = upstream_models / f"spark-shakespeare-{qtype}.gguf"
            llama_quantize(shipped_f32, out, qtype)
            made[qtype] = out
        return made[qtype]

    return get


@pytest.fixture(scope="session")
def stock_gemma2(upstream_models) -> Path:
    """A stock `gemma2` model (f32) with the shipped model's trained weights: its checkpoint with
    the Spark FFN input matrix split into Gemma-2's gate (the first r_f input rows, the rest 0)
    and up (the other rows) projections, and without the Spark keys. That is the Spark FFN
    without its threshold (k_f = F) and stock attention: not the trained model, but one whose
    greedy text does not collapse into one repeated token as random-weight models' does
    (spark-convert --synthetic tiny-dense), so batching differences would show."""
    src = np.load(MODEL_NPZ)
    cfg = json.loads(str(src["config"]))
    r = cfg["ffn_r"]
    arrays = {}
    for name in src.files:
        if name.endswith("mlp/spark_in"):
            w = src[name]  # [D, F]: rows :r_f feed the predictor (K1), rows r_f: the value (K2)
            gate, up = w.copy(), w.copy()
            gate[r:] = 0
            up[:r] = 0
            arrays[name.replace("spark_in", "gating_einsum")] = np.stack([gate, up])
        elif name == "config":
            spark_keys = ("ffn_k", "ffn_r", "attn_k", "attn_r")
            dense = {k: v for k, v in cfg.items() if k not in spark_keys}
            arrays[name] = np.array(json.dumps(dense))
        else:
            arrays[name] = src[name]
    npz = upstream_models / "gemma2-from-shipped.npz"
    np.savez(npz, **arrays)
    out = upstream_models / "gemma2-from-shipped-f32.gguf"
    run([spark_binary("spark-convert"), npz, out, "--outtype", "f32", "--quiet"])
    return out


@pytest.fixture(scope="session")
def out_dir() -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    return OUT_DIR
