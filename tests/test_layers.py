"""The package's import graph: no cycle anywhere, and `import leettriton` stays light.

The graph is read from the source with :mod:`ast` (every ``import`` statement, at module level or
inside a function), so the check needs nothing beyond the standard library and runs on every
machine; ``lint-imports`` checks the layers themselves in CI.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import leettriton

ROOT = os.path.dirname(os.path.abspath(leettriton.__file__))


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def import_graph() -> dict[str, set[str]]:
    """Module → the leettriton modules it imports (``from a import b`` counts ``a.b`` when that is a module,
    else ``a``, as import-linter reads it)."""
    modules = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                modules[_module_name(os.path.join(folder, f))] = os.path.join(folder, f)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        with open(path) as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), i.e. import cycles."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert "leettriton.registry" in graph["leettriton.plan"], "the graph misses a known import"
    assert "leettriton.kernels.abi" in graph["leettriton.methods.vanilla.kernels"], "relative imports unread"
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_problem_module_imports_nothing_of_the_package():
    assert import_graph()["leettriton.problem"] == set()


def test_importing_the_package_loads_no_bench_tuner_or_optional_dependency():
    code = ("import sys, leettriton; "
            "print(sorted(m for m in sys.modules if m.startswith(('leettriton.bench', 'leettriton.tune', "
            "'transformers', 'tabulate', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
