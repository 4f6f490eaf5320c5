"""The package's import graph: no cycle anywhere, and `import leettriton` stays light."""
from __future__ import annotations

import subprocess
import sys

import grimp


def _cycles(graph, modules) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), i.e. import cycles."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(m):
        index[m] = low[m] = counter[0]
        counter[0] += 1
        stack.append(m)
        on_stack.add(m)
        for n in graph.find_modules_directly_imported_by(m):
            if n not in modules:
                continue
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

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return found


def test_the_import_graph_has_no_cycle():
    graph = grimp.build_graph("leettriton")
    cycles = _cycles(graph, set(graph.modules))
    assert graph.find_modules_directly_imported_by("leettriton.api"), "the graph was not built"
    assert cycles == [], f"import cycles: {cycles}"


def test_cycle_finder_finds_a_cycle():
    class Graph:
        modules = {"a", "b", "c"}

        @staticmethod
        def find_modules_directly_imported_by(m):
            return {"a": {"b"}, "b": {"a"}, "c": {"a"}}[m]

    assert _cycles(Graph, Graph.modules) == [["a", "b"]]


def test_importing_the_package_loads_no_bench_tuner_or_optional_dependency():
    code = ("import sys, leettriton; "
            "print(sorted(m for m in sys.modules if m.startswith(('leettriton.bench', 'leettriton.tune', "
            "'transformers', 'tabulate', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
