"""The import graph of the shipped code has no cycle, type-only imports included, and
plugins import no internals of the command line.

The graph is read from the source, not from ``sys.modules``: every ``import`` and
``from ... import`` of every module of every distribution of the workspace (the core,
each backend, each plugin: the members ``pyproject.toml`` lists) counts, wherever it is
written (under ``if TYPE_CHECKING:``, inside a function), and relative imports are
resolved against the importing module's package. ``from package import name`` is an
edge to the submodule ``package.name`` when there is one, else to the package.

A cycle means two modules cannot be understood, tested or moved apart; where the core
needs something of a module that depends on it, it takes a protocol of
:mod:`taskmill.hosts` instead (docs/architecture.md, "Host interfaces").
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"

Graph = Mapping[str, frozenset[str]]


def modules_under(package_dir: Path) -> dict[str, Path]:
    """Every module of the package at ``package_dir``, by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def shipped_packages() -> list[Path]:
    """The top-level package of each distribution of the workspace (``src/<package>`` of
    every member the root ``pyproject.toml`` lists)."""
    workspace = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages: list[Path] = []
    for member in workspace["tool"]["uv"]["workspace"]["members"]:
        found = sorted(p.parent for p in (ROOT / member).glob("src/*/__init__.py"))
        assert found, f"workspace member {member} ships no package under src/"
        packages += found
    return packages


def shipped_modules() -> dict[str, Path]:
    """Every module of every distribution of the workspace, by dotted name."""
    modules: dict[str, Path] = {}
    for package in shipped_packages():
        found = modules_under(package)
        assert not found.keys() & modules.keys(), f"{package} repeats a module name"
        modules.update(found)
    return modules


def _named(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names ``node`` imports (submodules when a ``from`` names them)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(modules: Mapping[str, Path]) -> dict[str, frozenset[str]]:
    """Which of ``modules`` each of them imports, by any import statement anywhere in it."""
    graph: dict[str, frozenset[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            named = _named(node, name, is_package)
            if isinstance(node, ast.ImportFrom):
                # ``from a import b``: the submodule a.b if it is one, else a itself.
                base, *members = named
                submodules = [m for m in members if m in modules]
                named = submodules + ([base] if len(submodules) < len(members) else [])
            for target in named:
                while target and target not in modules:  # a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = frozenset(targets)
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The strongly connected components of ``graph`` (Tarjan's algorithm, without
    recursion), each sorted; a component of more than one module is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def a_cycle_through(component: Iterable[str], graph: Graph) -> list[str]:
    """One shortest import cycle inside ``component``, from its first module back to it."""
    members = sorted(component)
    start = members[0]
    inside = set(members)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for successor in sorted(graph[node] & inside):
                if successor == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if successor not in came_from:
                    came_from[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{members} is not a cycle")


def cycles(graph: Graph) -> list[str]:
    """Each import cycle of ``graph``: its modules, and one cycle through them."""
    return [
        f"{len(component)} modules {', '.join(component)}: "
        + " -> ".join(a_cycle_through(component, graph))
        for component in strongly_connected(graph)
        if len(component) > 1
    ]


def test_the_shipped_code_has_no_import_cycle_type_only_imports_included():
    modules = shipped_modules()
    packages = {name.partition(".")[0] for name in modules}
    assert {"taskmill", "taskmill_postgres", "taskmill_http", "taskmill_demo"} <= packages
    assert "taskmill.app" in modules and "taskmill.cli.parser" in modules
    graph = import_graph(modules)
    # The reader sees type-only imports (else it would find no cycle written that way;
    # the test below shows it sees relative ones and imports inside functions too), and
    # the imports between distributions: one graph holds them all.
    assert "taskmill.context" in graph["taskmill.attempt_hooks"]
    assert "taskmill.hosts" in graph["taskmill.operations"]
    assert "taskmill.app" in graph["taskmill_http.service"]
    found = cycles(graph)
    assert not found, "import cycles in the shipped code:\n" + "\n".join(found)


def test_the_check_finds_a_cycle_of_type_only_and_relative_imports(tmp_path: Path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import leaf\n")
    (package / "sub" / "leaf.py").write_text("X = 1\n")
    (package / "sub" / "deep.py").write_text("from ..b import B\nimport pkg.sub.leaf\n")
    (package / "a.py").write_text("from .b import B\nfrom pkg.sub import leaf\nA = 1\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\nB = 1\n"
    )
    (package / "c.py").write_text("def late():\n    from . import a\nC = 1\n")
    graph = import_graph(modules_under(package))
    assert graph["pkg.a"] == {"pkg.b", "pkg.sub.leaf"}
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}
    assert graph["pkg.sub.deep"] == {"pkg.b", "pkg.sub.leaf"}
    assert cycles(graph) == ["3 modules pkg.a, pkg.b, pkg.c: pkg.a -> pkg.b -> pkg.c -> pkg.a"]


def test_plugins_import_the_command_line_only_through_its_public_package():
    internals: list[str] = []
    sources = sorted(PLUGINS.glob("*/src/*/**/*.py"))
    assert any(p.parts[-2] == "taskmill_demo" for p in sources)
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            internals += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                for name in names
                if name.startswith("taskmill.cli.")
            ]
    assert not internals, "plugins must use `taskmill.cli`'s public API:\n" + "\n".join(internals)
