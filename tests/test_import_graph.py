"""The package's import graph: no cycles (function-level imports included) and the
one-way flow the README's Development section draws.

Read with ``ast`` from the source files, so an import hidden inside a function
counts the same as one at the top of a module.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "opdump"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> List[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = current.split(".") if is_package else current.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    # ``from .x import y`` may import the submodule ``x.y``: count it when it exists
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph() -> Dict[str, Set[str]]:
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = _resolve(name, is_package, node)
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_package_inits(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """A package's ``__init__`` re-exporting its children is not a cycle with them:
    edges from a child to an ancestor package's ``__init__`` are dropped."""
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def test_no_import_cycles():
    cycles = _cycles(_without_package_inits(import_graph()))
    assert cycles == [], "import cycles (function-level imports included): %s" % cycles


def test_the_scanner_sees_function_level_imports(tmp_path):
    """The check can fail: a cycle built only from function-level imports is found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(graph) == [["a", "b"]]
    src = "def f():\n    from .b import x\n"
    node = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)][0]
    assert _resolve("opdump.pkg.a", False, node)[0] == "opdump.pkg.b"


@pytest.mark.parametrize("layer, forbidden", [
    ("opdump.format", ("opdump.write", "opdump.capture", "opdump.analysis", "opdump.stats",
                       "opdump.session", "opdump.recorder", "opdump.cli", "opdump.config")),
    ("opdump.capture", ("opdump.write", "opdump.analysis", "opdump.cli")),
    ("opdump.write", ("opdump.capture", "opdump.analysis", "opdump.cli")),
    ("opdump.analysis", ("opdump.write", "opdump.capture", "opdump.session", "opdump.recorder", "opdump.cli")),
    ("opdump.config", ("opdump.capture", "opdump.write", "opdump.analysis", "opdump.session", "opdump.cli")),
])
def test_data_flows_one_way(layer, forbidden):
    graph = import_graph()
    bad = sorted((m, t) for m, ts in graph.items() if m == layer or m.startswith(layer + ".")
                 for t in ts if any(t == f or t.startswith(f + ".") for f in forbidden))
    assert bad == [], f"{layer} must not import {forbidden}: {bad}"


@pytest.mark.parametrize("name", ["compare", "locate", "watch"])
def test_analysis_functions_named_like_their_modules(name):
    """``from opdump.analysis import compare`` is the function even when the module
    ``opdump.analysis.compare`` was imported first (a fresh interpreter, real imports)."""
    import subprocess
    import sys
    code = (f"import opdump.analysis.{name}\nfrom opdump.analysis import {name}\n"
            f"import types\nassert isinstance({name}, types.FunctionType), {name}\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
