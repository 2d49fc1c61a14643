#!/usr/bin/env python3
"""streamd's package graph from its imports (``ast``, nothing is imported).

    tools/package_graph.py            edges "package -> packages it imports", then the cycles
    tools/package_graph.py --modules  the same per module

A package is the first name under ``streamd`` (``streamd/gpu/x.py`` is ``gpu``; a top-level module is its own
node). Imports inside functions count too: a lazy import is still a dependency. Exit 1 when packages form a
cycle.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "streamd"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The streamd modules a file imports (``from streamd.a import b`` names ``streamd.a.b`` when that is a
    module, else ``streamd.a``)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("streamd"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if not base.startswith("streamd"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                as_path = ROOT / Path(*sub.split("."))
                found.add(sub if as_path.with_suffix(".py").exists() or as_path.is_dir() else base)
    return found


def node_of(module: str, modules: bool) -> str:
    parts = module.split(".")
    if modules or len(parts) < 2:
        return module
    return parts[1]


def graph(modules: bool = False) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PKG.rglob("*.py")):
        if "bundled" in path.parts:
            continue
        src = node_of(module_name(path), modules)
        edges.setdefault(src, set())
        for target in imports(path):
            dst = node_of(target, modules)
            if dst != src and dst != "streamd":
                edges[src].add(dst)
    return dict(edges)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--modules", action="store_true")
    args = p.parse_args()
    edges = graph(args.modules)
    for src in sorted(edges):
        print(f"{src} -> {', '.join(sorted(edges[src])) or '(nothing)'}")
    found = cycles(edges)
    for comp in found:
        print(f"CYCLE: {' <-> '.join(comp)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
