"""The package's shape, checked from its source: no import cycle, kernel families that do not know who searches them,
and every import inside a function saying why it is there (an optional dependency or start-up cost)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in (SRC / "gemmrl").rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (p, pkg)
    return out


MODULES = _modules()


def _targets(mod: str, pkg: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = mod.split(".") if pkg else mod.split(".")[:-1]
        if node.level:
            base = base[:len(base) - (node.level - 1)]
            head = ".".join(base + ([node.module] if node.module else []))
        else:
            head = node.module or ""
        names = [f"{head}.{a.name}" if f"{head}.{a.name}" in MODULES else head for a in node.names]
    out = []
    for n in names:
        while n and n not in MODULES and "." in n:
            n = n.rsplit(".", 1)[0]
        if n in MODULES and n != mod:
            out.append(n)
    return out


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """Module -> the gemmrl modules it imports (anywhere in it); and the function-local imports with no reason given
    (no comment on the import's line or the line above it)."""
    graph, silent = {}, []
    for mod, (path, pkg) in MODULES.items():
        if ".jit." in mod:  # Triton sources, loaded by file path under private names (runtime.py)
            continue
        text = path.read_text()
        lines = text.split("\n")
        graph[mod] = set()

        def visit(node, depth):
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.Import, ast.ImportFrom)):
                    graph[mod].update(_targets(mod, pkg, ch))
                    if depth and "#" not in lines[ch.lineno - 1] and not lines[ch.lineno - 2].strip().startswith("#"):
                        silent.append((mod, ch.lineno, lines[ch.lineno - 1].strip()))
                elif isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(ch, depth + 1)
                else:
                    visit(ch, depth)
        visit(ast.parse(text), 0)
    return graph, silent


GRAPH, SILENT = _graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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
    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_the_graph_sees_the_package():
    assert {"gemmrl.serve.dispatch", "gemmrl.kernels.registry", "gemmrl.cli.main"} <= set(GRAPH)
    assert "gemmrl.kernels.registry" in GRAPH["gemmrl.library"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]  # the finder finds one


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_kernel_families_do_not_import_the_search():
    bad = sorted((m, t) for m, ts in GRAPH.items() if m.startswith("gemmrl.kernels") for t in ts
                 if t.startswith("gemmrl.search"))
    assert bad == []


def test_imports_inside_functions_say_why():
    assert SILENT == [], "imports at module top, or a comment giving the reason (optional dependency, start-up cost)"


@pytest.mark.parametrize("flat", ["dispatch", "bench", "evaluate", "report_plots", "tune_cli", "fastpath"])
def test_no_flat_module_is_left_behind(flat):
    assert not (SRC / "gemmrl" / f"{flat}.py").exists()
