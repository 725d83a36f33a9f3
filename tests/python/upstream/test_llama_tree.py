"""tools/llama-tree.sh, the one command that makes the patched llama.cpp tree (the pinned
crate's sources, the project's new files from patches/llama.cpp/files, the series of edits):
its tag is the one the plugin was built against, its tree is the one cargo builds, and an
edit checkout (--git) exports back to an unchanged series."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path("tools") / "llama-tree.sh"
UPSTREAM = Path(os.environ.get("SPARK_UPSTREAM_DIR", ROOT / "target" / "upstream"))
PLUGIN = UPSTREAM / "lib" / "libggml-spark.so"
# What tools/upstream.sh adds to the cargo build's tree besides the sdist's sources (which
# --tools adds too): the web UI it builds, at tools/ui/dist.
ADDED_BY_UPSTREAM_SH = {"dist"}


def llama_tree(*args: str, repo: Path = ROOT) -> subprocess.CompletedProcess:
    res = subprocess.run(["bash", str(repo / SCRIPT), *args], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, f"llama-tree.sh {' '.join(args)}: {res.returncode}\n{res.stderr}"
    return res


def cargo_tree() -> Path:
    """The source directory of the patched llama.cpp that cargo built for tools/upstream.sh (its
    cargo messages name the build script's OUT_DIR; cmake's cache names the sources)."""
    messages = UPSTREAM / "dl" / "cargo-messages.json"
    out_dir = None
    for line in messages.read_text().splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") == "build-script-executed" \
                and "patches/llama-cpp-sys-2" in m.get("package_id", ""):
            out_dir = m["out_dir"]
    assert out_dir, f"no patched llama-cpp-sys-2 build in {messages}"
    cache = (Path(out_dir) / "build" / "CMakeCache.txt").read_text()
    return Path(re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache, re.M).group(1))


def differences(a: Path, b: Path, skip: set[str]) -> list[str]:
    """Paths that differ between trees a and b (content, or present in one only), leaving out
    entries named in `skip` at any depth."""
    out = []
    cmp = filecmp.dircmp(a, b, ignore=sorted(skip))
    out += [f"only in {a}: {n}" for n in cmp.left_only]
    out += [f"only in {b}: {n}" for n in cmp.right_only]
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    out += [str(a / n) for n in mismatch + errors]
    for d in cmp.common_dirs:
        out += differences(a / d, b / d, skip)
    return out


def test_the_tag_is_the_one_the_plugin_was_built_against():
    tag = llama_tree("--tag").stdout.strip()
    assert re.fullmatch(r"spark-[0-9a-f]{12}", tag), tag
    built = set(re.findall(rb"spark-[0-9a-f]{12}", PLUGIN.read_bytes()))
    assert built == {tag.encode()}, (tag, built)


def test_the_tree_is_the_one_cargo_builds(tmp_path):
    # with --tools: the sources tools/upstream.sh adds to the cargo build's tree, from the same
    # pinned sdist (the GPU machine builds this tree with plain cmake)
    llama_tree("--tools", str(tmp_path / "t"))
    made, built = tmp_path / "t" / "llama.cpp", cargo_tree()
    assert (made / "src" / "models" / "spark-gemma2.cpp").is_file()
    assert differences(made, built, ADDED_BY_UPSTREAM_SH) == []


def test_an_edit_checkout_exports_an_unchanged_series(tmp_path):
    # a copy of what the script reads, so that --export writes nowhere in this checkout
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    for f in ("tools/llama-tree.sh", "tools/upstream.sh", "patches/spark-llama-prep/build.rs"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, repo / f)
    shutil.copytree(ROOT / "patches" / "llama.cpp", repo / "patches" / "llama.cpp")
    llama_tree("--git", str(tmp_path / "edit"), repo=repo)
    git = ["git", "-C", str(tmp_path / "edit" / "llama.cpp")]
    log = subprocess.run(git + ["log", "--format=%s", "spark-files..HEAD"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert len(log) == len(list((ROOT / "patches" / "llama.cpp").glob("*.patch")))
    res = llama_tree("--export", str(tmp_path / "edit"), repo=repo)
    assert "nothing changed" in res.stderr, res.stderr
    assert differences(repo / "patches" / "llama.cpp", ROOT / "patches" / "llama.cpp", set()) == []
    # an edit to a new file travels back to patches/llama.cpp/files, nothing else changes
    graph = tmp_path / "edit" / "llama.cpp" / "src" / "models" / "spark-gemma2.cpp"
    graph.write_text(graph.read_text() + "// edited\n")
    res = llama_tree("--export", str(tmp_path / "edit"), repo=repo)
    assert "files/src/models/spark-gemma2.cpp updated" in res.stderr, res.stderr
    assert (repo / "patches/llama.cpp/files/src/models/spark-gemma2.cpp").read_text().endswith(
        "// edited\n")
    assert not any("written" in line for line in res.stderr.splitlines()), res.stderr


def test_spark_gguf_pins_llama_cpps_layer_limit(tmp_path):
    """spark-gguf refuses a block count llama.cpp's loader would stop on: its LLAMA_MAX_LAYERS is
    the patched tree's."""
    llama_tree(str(tmp_path / "t"))
    header = (tmp_path / "t" / "llama.cpp" / "src" / "llama-hparams.h").read_text()
    upstream = re.search(r"#define\s+LLAMA_MAX_LAYERS\s+(\d+)", header).group(1)
    schema = (ROOT / "spark-gguf" / "src" / "schema.rs").read_text()
    ours = re.search(r"pub const LLAMA_MAX_LAYERS: u64 = (\d+);", schema).group(1)
    assert ours == upstream, (ours, upstream)
