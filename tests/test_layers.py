"""The package's import graph: no cycles, and production code never imports the test package.

The graph is read from the source (every ``import`` statement, at module level or inside a
function, except those under ``if TYPE_CHECKING:``), so a lazy import that closes a circle is
caught too. An edge runs from a module to each module it names; the implicit import of a
module's parent packages is not an edge (every submodule has it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import trio_swe

PACKAGE = Path(trio_swe.__file__).parent


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


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
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module name -> the trio_swe modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts)
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                targets = []
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in modules else source)
            for target in targets:
                # `import trio_swe.x.y` names the deepest module of the package it reaches.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_graph_reader_sees_the_known_edges() -> None:
    graph = import_graph()
    assert "trio_swe.aio" in graph["trio_swe.integrations.slime"]
    assert "trio_swe.rollout" in graph["trio_swe.aio"]
    assert "trio_swe.episode" in graph["trio_swe.rollout"]
    # A cycle is found when there is one.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert _cycles(import_graph()) == []


def test_production_code_never_imports_the_test_package() -> None:
    offenders = {
        name: sorted(t for t in targets if t.startswith("trio_swe.testing"))
        for name, targets in import_graph().items()
        if not name.startswith("trio_swe.testing")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def package_graph(graph: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Top-level part (``trio_swe.agents``, ``trio_swe.config``...) -> the parts it imports.

    A module-level check misses a circle between packages whose modules never import each
    other's *same* modules (``gateway._server`` -> ``agents._policy`` while ``agents._cli`` ->
    ``gateway``): folded onto their packages, the two edges make one.
    """
    graph = import_graph() if graph is None else graph

    def part(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = part(name)
        if here == "trio_swe":  # the face re-exports everything: it is above all of them
            continue
        edges = out.setdefault(here, set())
        edges.update(t for t in map(part, targets) if t not in (here, "trio_swe"))
    return out


def test_the_package_graph_folds_modules_onto_their_parts() -> None:
    folded = package_graph({"trio_swe.a.x": {"trio_swe.b.y"}, "trio_swe.b.z": {"trio_swe.a"}})
    assert folded == {"trio_swe.a": {"trio_swe.b"}, "trio_swe.b": {"trio_swe.a"}}
    assert _cycles(folded) == [["trio_swe.a", "trio_swe.b"]]


def test_no_package_level_cycles() -> None:
    assert _cycles(package_graph()) == []


def test_policies_sit_below_agents_and_gateway() -> None:
    packages = package_graph()
    assert "trio_swe.policy" in packages["trio_swe.agents"]
    assert "trio_swe.policy" in packages["trio_swe.gateway"]
    assert not packages["trio_swe.policy"] & {"trio_swe.agents", "trio_swe.gateway"}
