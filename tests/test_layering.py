"""The package structure the README states (Layout): no import cycle between metricsd's packages,
and each layer imports only what lies below it.

Imports are read from the source with ``ast`` (every ``import`` and ``from ... import``, including
the ones inside functions), so a lazy import cannot hide a cycle. A *unit* is a subpackage
(``metricsd.store``) or a top-level module (``metricsd.model``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "metricsd"

# The bottom: plain data, time and settings. Any unit may import these.
BOTTOM = {"metricsd", "metricsd.model", "metricsd.selector", "metricsd.columns", "metricsd.clock", "metricsd.durations",
          "metricsd.defaults", "metricsd.memory", "metricsd.parentdeath", "metricsd.ports", "metricsd.proto"}

# unit -> the units (besides BOTTOM and itself) it may import. A unit not named here is not allowed.
ALLOWED: dict[str, set[str]] = {
    "metricsd.codec": set(),
    "metricsd.maths": set(),
    "metricsd.security": set(),
    "metricsd.rpc": {"metricsd.maths", "metricsd.security"},
    "metricsd.store": {"metricsd.codec", "metricsd.maths", "metricsd.rpc"},
    "metricsd.cluster": {"metricsd.maths"},
    "metricsd.replica": {"metricsd.maths", "metricsd.rpc", "metricsd.store", "metricsd.cluster", "metricsd.security"},
    "metricsd.proxy": {"metricsd.maths", "metricsd.rpc", "metricsd.cluster", "metricsd.security"},
    "metricsd.federation": {"metricsd.maths", "metricsd.rpc", "metricsd.proxy", "metricsd.security"},
    "metricsd.promql": {"metricsd.maths", "metricsd.rpc"},
    "metricsd.http": {"metricsd.maths", "metricsd.rpc", "metricsd.promql", "metricsd.security"},
    "metricsd.agent": {"metricsd.maths", "metricsd.rpc", "metricsd.security"},
    "metricsd.consumers": {"metricsd.maths", "metricsd.rpc", "metricsd.cluster", "metricsd.security"},
    "metricsd.onward": {"metricsd.maths", "metricsd.rpc", "metricsd.http", "metricsd.agent", "metricsd.security"},
    "metricsd.k8sapi": {"metricsd.maths", "metricsd.rpc", "metricsd.promql", "metricsd.http", "metricsd.security"},
    "metricsd.cmd": {"metricsd.codec", "metricsd.maths", "metricsd.rpc", "metricsd.store", "metricsd.cluster",
                     "metricsd.replica", "metricsd.proxy", "metricsd.federation", "metricsd.promql", "metricsd.http",
                     "metricsd.agent",
                     "metricsd.consumers", "metricsd.security", "metricsd.k8sapi", "metricsd.onward"},
    "metricsd.__main__": {"metricsd.cmd"},
}
# The bottom imports nothing above it (among themselves, the cycle test keeps them in order).
for _unit in BOTTOM:
    ALLOWED.setdefault(_unit, set())


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def imported_modules(path: Path, module: str) -> set[str]:
    """Every metricsd module ``path`` imports, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return {m for m in out if m == "metricsd" or m.startswith("metricsd.")}


def unit_graph() -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the modules of the first unit that import it (for the message)."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(PACKAGE.rglob("*.py")):
        if "proto" in path.relative_to(PACKAGE).parts:
            continue
        module = module_name(path)
        for target in imported_modules(path, module):
            a, b = unit_of(module), unit_of(target)
            if a != b:
                graph[a][b].add(module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "d": {"a"}}) == []


def test_no_import_cycle_between_packages() -> None:
    graph = unit_graph()
    found = cycles({a: set(bs) for a, bs in graph.items()})
    described = [
        " -> ".join(c) + ": " + "; ".join(f"{a} -> {b} in {sorted(graph[a][b])}" for a in c for b in c if b in graph[a])
        for c in found
    ]
    assert not found, "import cycles between packages:\n" + "\n".join(described)


def test_every_unit_is_placed_in_a_layer() -> None:
    units = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py") if "proto" not in p.relative_to(PACKAGE).parts}
    assert units - set(ALLOWED) == set(), "a new package or top-level module: give it a layer in ALLOWED"


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_each_layer_imports_only_what_lies_below_it(unit: str) -> None:
    graph = unit_graph()
    allowed = ALLOWED[unit] | BOTTOM
    wrong = {b: sorted(mods) for b, mods in graph.get(unit, {}).items() if b not in allowed}
    assert not wrong, f"{unit} may not import {sorted(wrong)}: {wrong}"


@pytest.mark.parametrize("module, forbidden", [
    ("metricsd.agent.batches", ("metricsd.store", "metricsd.cluster", "metricsd.proxy", "metricsd.replica")),
    ("metricsd.agent.pusher", ("metricsd.store", "metricsd.cluster", "metricsd.proxy", "metricsd.replica")),
    ("metricsd.consumers.hpa.controller", ("metricsd.store", "metricsd.cluster", "metricsd.proxy",
                                           "metricsd.replica")),
    ("metricsd.rpc.client", ("metricsd.store", "metricsd.cluster", "metricsd.proxy", "metricsd.replica")),
    ("metricsd.codec", ("metricsd.model", "metricsd.store", "metricsd.rpc")),
    ("metricsd.http.server", ("metricsd.store", "metricsd.proxy", "metricsd.replica", "metricsd.cluster")),
])
def test_importing_a_module_loads_nothing_above_its_layer(module: str, forbidden: tuple[str, ...]) -> None:
    """The dynamic check: a fresh interpreter imports ``module`` and lists what got loaded."""
    code = (f"import sys, {module}\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('metricsd'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert not bad, f"importing {module} loads {bad}"
