"""The crates' modules import one way: tools/module-graph.py finds no import cycle in any crate of
the workspace (file granularity: a kernel never imports a feature, a feature folder's files
never import each other in a circle), and it does find a cycle planted in a scratch crate."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "module-graph.py"


def crate_sources() -> list[Path]:
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text())
    members = manifest["workspace"]["members"] + manifest["workspace"].get("exclude", [])
    return [ROOT / m / "src" for m in members if (ROOT / m / "src").is_dir()]


def run(*dirs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, dirs)], capture_output=True,
                          text=True, timeout=60)


def test_no_crate_of_the_workspace_has_an_import_cycle():
    sources = crate_sources()
    assert len(sources) >= 5, sources
    res = run(*sources)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_planted_cycle_is_found(tmp_path):
    src = tmp_path / "src"
    (src / "feature").mkdir(parents=True)
    (src / "lib.rs").write_text("pub mod kernels;\npub mod feature;\npub use kernels::Table;\n")
    (src / "kernels.rs").write_text("use crate::feature::shapes::Row;\npub struct Table;\n")
    (src / "feature" / "mod.rs").write_text("pub mod shapes;\n")
    # through the crate root's re-export: still the kernels module
    (src / "feature" / "shapes.rs").write_text("use crate::Table;\npub struct Row;\n")
    res = run(src)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "cycle: feature::shapes, kernels" in res.stdout, res.stdout
