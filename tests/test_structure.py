"""The shape of the code base, checked statically over streamd/ (ast only, nothing imported).

- No import cycles between streamd's modules, counting every import (also those inside functions, which
  streamd uses to load optional backends lazily), except ``if TYPE_CHECKING:`` blocks; none between its
  packages either, and no package imports one of a higher layer (``LAYERS``, bottom up).
- No module over 500 lines.
- One module defines CUDA error handling (``streamd/gpu/cuda.py``: ``CUDAError`` and ``check``); every other
  module that talks to the CUDA driver goes through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "streamd"
MAX_LINES = 500
# Modules still over the limit, with who is splitting them. Remove an entry when its module shrinks (the
# test fails while a listed module is already within the limit, so this list only gets shorter).
OVER_LIMIT: dict[str, str] = {}
# Imports allowed against the layers while a caller moves over, with what ends each. Remove an entry when its
# import is gone (the test fails while a listed import no longer exists, so this list only gets shorter).
TRANSITIONAL: dict[tuple[str, str], str] = {}
# Packages that must not import each other even where the layers would allow it.
FORBIDDEN = {("analytics", "sinks"), ("analytics", "worker")}
CUDA_ERRORS = "streamd.gpu.cuda"
# streamd's packages (and top-level modules) bottom up: each may import its own layer's and lower ones only.
LAYERS: list[set[str]] = [
    {"types", "exitcodes", "resources", "logutil", "latency", "systemd", "geometry"},
    {"config"},
    {"protocol"},  # the supervisor <-> worker messages: below both processes' packages
    {"gpu"},  # the low CUDA layer: context, streams, buffers, driver calls, kernel loader, graph cache
    {"engines"},
    {"stages"},  # preprocess / postprocess (spec, CPU twin, CUDA side by side) and the stage contract
    {"checks", "ingest", "analytics", "sinks"},
    # clips: packet ring -> MP4 remux; above ingest and analytics. shared_engine: one engine process per GPU
    # that decode workers feed (its server runs pipeline.build's stages)
    {"pipeline", "web", "clips", "shared_engine"},
    {"worker"},
    {"cluster"},  # placement and failover across nodes (etcd): below the supervisor that runs its streams
    {"supervisor"},
    {"cli", "build_engine", "__main__"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the streamd modules it imports (a name imported from a package counts as the submodule
    when one exists by that name, else as the package)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def checked_graph() -> dict[str, set[str]]:
    """``import_graph`` less the ``TRANSITIONAL`` imports."""
    graph = import_graph()
    for src, dst in TRANSITIONAL:
        graph.get(src, set()).discard(dst)
    return graph


def test_transitional_imports_still_exist() -> None:
    graph = import_graph()
    gone = [f"{a} -> {b}" for a, b in TRANSITIONAL if b not in graph.get(a, set())]
    assert not gone, f"no longer imported; remove from TRANSITIONAL: {gone}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _path_in(graph: dict[str, set[str]], component: list[str]) -> str:
    """One concrete loop through ``component``, for the failure message."""
    start = component[0]
    members = set(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in members)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return " -> ".join([*path, start])
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            return " -> ".join(path) + " -> ..."
        path.append(fresh[0])
        seen.add(fresh[0])


def test_no_import_cycles() -> None:
    graph = checked_graph()
    assert "streamd.engines.base" in graph and "streamd.gpu.cuda" in graph["streamd.gpu.driver_api"]
    loops = [_path_in(graph, c) for c in cycles(graph)]
    assert not loops, "import cycles:\n  " + "\n  ".join(loops)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto streamd's packages (a top-level module is its own node)."""

    def package(module: str) -> str:
        return module.split(".")[1] if module.count(".") >= 1 else module

    folded: dict[str, set[str]] = {}
    for src, targets in graph.items():
        if src == "streamd":
            continue
        edges = folded.setdefault(package(src), set())
        edges.update(package(t) for t in targets if t != "streamd" and package(t) != package(src))
    return folded


def test_no_package_cycles_and_no_upward_imports() -> None:
    packages = package_graph(checked_graph())
    layer = {name: k for k, names in enumerate(LAYERS) for name in names}
    assert set(packages) <= set(layer), f"packages with no layer in LAYERS: {set(packages) - set(layer)}"
    loops = [_path_in(packages, c) for c in cycles(packages)]
    assert not loops, "package cycles:\n  " + "\n  ".join(loops)
    upward = sorted(f"{a} -> {b}" for a, bs in packages.items() for b in bs if layer[b] > layer[a])
    assert not upward, "imports of a higher layer:\n  " + "\n  ".join(upward)
    forbidden = sorted(f"{a} -> {b}" for a, b in FORBIDDEN if b in packages.get(a, set()))
    assert not forbidden, "forbidden imports:\n  " + "\n  ".join(forbidden)


def test_cycle_finder_finds_a_lazy_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert _path_in(graph, ["a", "b", "c"]) == "a -> b -> c -> a"


def test_no_module_over_500_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in OVER_LIMIT}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
    shrunk = [name for name in OVER_LIMIT if sizes.get(name, 0) <= MAX_LINES]
    assert not shrunk, f"within {MAX_LINES} lines now; remove from OVER_LIMIT: {shrunk}"


def test_one_module_defines_cuda_error_handling() -> None:
    """Only streamd/gpu/cuda.py defines a CUDA error class or reads cuda.bindings' CUresult codes; the rest
    use its ``check`` and ``CUDAError``."""
    definers: dict[str, list[str]] = {}
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            what = None
            if (
                isinstance(node, ast.ClassDef)
                and "cuda" in node.name.lower()
                and "error" in node.name.lower()
            ):
                what = f"class {node.name}"
            elif isinstance(node, ast.Attribute) and node.attr in (
                "cuGetErrorName",
                "cuGetErrorString",
                "CUresult",
            ):
                what = node.attr
            if what:
                definers.setdefault(name, []).append(what)
    assert set(definers) == {CUDA_ERRORS}, f"CUDA error handling outside {CUDA_ERRORS}: {definers}"
