"""Fixtures for the spark-convert end-to-end tests; makes convert_helpers importable."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory) -> Path:
    """A real 512-piece SentencePiece BPE model with byte fallback and Gemma's special ids."""
    import sentencepiece as spm

    text = []
    words = ["spark", "gemma", "sparse", "token", "model", "attention", "the", "of", "and", "to",
             "neuron", "predictor", "window", "layer", "weight", "vector", "matrix", "softmax"]
    for i in range(4000):
        text.append(" ".join(words[(i * 7 + j * 3) % len(words)] + str((i + j) % 97) for j in range(12)))
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=buf, vocab_size=512, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", pad_id=0, eos_id=1, bos_id=2,
        unk_id=3, minloglevel=2)
    path = tmp_path_factory.mktemp("sp") / "tok.model"
    path.write_bytes(buf.getvalue())
    return path
