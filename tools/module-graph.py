#!/usr/bin/env python3
"""The import graph of a Rust crate, one node per source file (module), and its cycles.

An edge `a -> b` is a path of module `a` that names module `b` or an item in it: `use crate::..`,
`use super::..`, `use self::..` (braces expanded), `crate::b::item` and `super::..` anywhere in
the code, and a parent's bare `child::item`. Comments and a file's trailing unit-test module
(`#[cfg(test)] mod tests`, which belongs to its file) are left out. This reads source text, not
the compiler's resolution: a macro that builds paths, or a `use` renamed and re-exported, can
hide an edge.

Usage: tools/module-graph.py CRATE_SRC_DIR... [--edges]
  prints per crate the module and edge counts and every cycle (strongly connected component of
  more than one module); exit status 1 when a crate has a cycle. --edges lists every edge."""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+tests\b")
REEXPORT_OR_USE = re.compile(
    r"(pub(?:\([a-z]+\))?\s+)?\buse\s+(crate|super|self|[a-z_][a-z0-9_]*)((?:::[\w{}, :*\n]+)?)\s*;")


def modules(src: Path) -> dict[str, Path]:
    """Module path (`a::b`, '' for the crate root) -> file. The root is lib.rs (a main.rs beside
    it, and src/bin/, are other crates: binaries that use the library), else main.rs."""
    out = {}
    has_lib = (src / "lib.rs").is_file()
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if has_lib and (rel == Path("main.rs") or rel.parts[0] == "bin"):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        out["::".join(parts)] = path
    return out


def code_of(path: Path) -> str:
    text = re.sub(r"//[^\n]*", "", path.read_text())
    cut = TEST_MODULE.search(text)
    return text[:cut.start()] if cut else text


def use_targets(prefix: list[str], tree: str) -> list[list[str]]:
    """The paths a `use` tree names (`::a::{b, c::d}` under `prefix`)."""
    if not tree.startswith("::"):
        return [prefix]
    tree = tree[2:]
    if tree.startswith("{"):
        items, depth, cur = [], 0, ""
        for ch in tree[1:-1]:
            depth += ch == "{"
            depth -= ch == "}"
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        items.append(cur)
        out = []
        for item in filter(None, items):
            head, _, rest = item.partition("::")
            if head == "self":
                out.append(prefix)
            else:
                out += use_targets(prefix + [head], "::" + rest if rest else "")
        return out
    m = re.match(r"([\w*]+)(.*)", tree)
    return use_targets(prefix + [m.group(1)], m.group(2)) if m else [prefix]


def parent(mod: str) -> str:
    return mod.rsplit("::", 1)[0] if "::" in mod else ""


def graph(src: Path) -> tuple[set, dict]:
    mods = modules(src)
    names = set(mods)

    # names a module re-exports (`pub use path::Name;`): a path through the re-export depends on
    # the module that defines the item, not on the one that passes it on (a crate root's facade)
    reexports: dict[str, dict[str, list[str]]] = defaultdict(dict)
    uses: dict[str, list[tuple[bool, list[str]]]] = {}
    for mod, path in mods.items():
        here = mod.split("::") if mod else []
        uses[mod] = []
        for m in REEXPORT_OR_USE.finditer(code_of(path)):
            public, base, tree = m.group(1), m.group(2), re.sub(r"\s+", "", m.group(3))
            if base in ("crate", "super", "self"):
                start = [] if base == "crate" else here[:-1] if base == "super" else here
                targets = use_targets(start, tree)
            else:  # a child module by its bare name
                targets = use_targets(here + [base], tree)
            uses[mod] += [(bool(public), t) for t in targets]
            if public:
                for t in targets:
                    if t and t[-1] != "*":
                        reexports[mod][t[-1]] = t

    def resolve(parts: list[str], depth: int = 0) -> str | None:
        for i in range(len(parts), -1, -1):
            name = "::".join(parts[:i])
            if name in names:
                rest = parts[i:]
                via = reexports[name].get(rest[0]) if rest else None
                if via is not None and via != parts and depth < 8:
                    return resolve(via + rest[1:], depth + 1) or name
                return name
        return None

    edges = defaultdict(set)
    for mod, path in mods.items():
        code = code_of(path)
        here = mod.split("::") if mod else []
        found = [t for _, t in uses[mod]]
        found += [p.group(1).split("::")[1:] for p in re.finditer(r"\bcrate((?:::\w+)+)", code)]
        found += [here[:-1] + p.group(1).split("::")[1:]
                  for p in re.finditer(r"\bsuper((?:::\w+)+)", code)]
        for child in (c for c in names if c and parent(c) == mod):
            if re.search(r"(?<![\w:])" + re.escape(child.rsplit("::", 1)[-1]) + r"::", code):
                found.append(child.split("::"))
        for parts in found:
            target = resolve([p for p in parts if p != "*"])
            if target is not None and target != mod:
                edges[mod].add(target)
    return names, edges


def cycles(names: set, edges: dict) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], 0
    for root in sorted(names):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main(argv: list[str]) -> int:
    show_edges = "--edges" in argv
    dirs = [a for a in argv if a != "--edges"]
    if not dirs:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    status = 0
    for d in dirs:
        src = Path(d)
        if not src.is_dir():
            print(f"module-graph: {d}: not a directory", file=sys.stderr)
            return 2
        names, edges = graph(src)
        found = cycles(names, edges)
        print(f"{d}: {len(names)} modules, {sum(map(len, edges.values()))} edges, "
              f"{len(found)} cycles")
        for comp in found:
            print("  cycle: " + ", ".join(c or "(crate root)" for c in comp))
            status = 1
        if show_edges:
            for m in sorted(edges):
                print(f"  {m or '(crate root)'} -> {', '.join(sorted(edges[m]))}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
