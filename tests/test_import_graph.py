"""No import circles among the modules of the project's packages (issue 31): core types never
import their Megatron adapters, the adapters import them.

The graph is read statically from each module's source (the AST). An edge is every import the
module can execute: at module level, in class bodies, and inside functions, since a deferred
import hides a circle without removing it. Imports under ``if TYPE_CHECKING:`` are left out:
they never run, and they name types only (the packages' ``__init__`` lists its lazy exports
there). ``from a import b`` is an edge to ``a.b`` where that is a module, else to ``a``.
"""

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
NAMES = ("megafmt", "megaindex", "megaload", "megadist")


def module_files(source_roots: list[Path]) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module under the given ``src`` folders."""
    found = {}
    for root in source_roots:
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def imported_names(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``module`` (at ``path``) imports, itself excluded."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                names.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in names if name in known and name != module}


def import_graph(source_roots: list[Path]) -> dict[str, set[str]]:
    known = module_files(source_roots)
    return {module: imported_names(module, path, known) for module, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle as a path ``[a, b, ..., a]``: one per strongly connected component of
    more than one module (Tarjan's algorithm, iterative, so its depth is bounded)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(graph):
        if start in order:
            continue
        work = [(start, iter(sorted(graph[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
            elif target not in order:
                order[target] = low[target] = len(order)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in on_stack:
                low[node] = min(low[node], order[target])
    return [circle_through(component, graph) for component in components]


def circle_through(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest circle from the component's first module back to itself (breadth first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle through {sorted(component)}")


def test_no_package_has_an_import_circle():
    graph = import_graph([PACKAGES / name / "src" for name in NAMES])
    assert {"megafmt", "megaindex.gpt_dataset", "megadist.megatron"} <= set(graph)
    found = [" -> ".join(circle) for circle in circles(graph)]
    assert found == [], "import circles: " + "; ".join(found)


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "src"


@pytest.mark.parametrize(
    ("core", "expected"),
    [
        ("from pkg.adapter import adapt\n", [["pkg.adapter", "pkg.core", "pkg.adapter"]]),
        ("def later():\n    from . import adapter\n", [["pkg.adapter", "pkg.core", "pkg.adapter"]]),
        ("class Core:\n    import pkg.adapter\n", [["pkg.adapter", "pkg.core", "pkg.adapter"]]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.adapter\n", []),
        ("import json\n", []),
    ],
)
def test_a_circle_is_found_and_named(tmp_path, core, expected):
    src = write_package(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/core.py": core, "pkg/adapter.py": "from pkg.core import X\n"},
    )
    assert circles(import_graph([src])) == expected


def test_a_longer_circle_is_named_in_order(tmp_path):
    src = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "import pkg.c\n",
            "pkg/c.py": "from .a import thing\n",
            "pkg/d.py": "import pkg.a\n",
        },
    )
    assert circles(import_graph([src])) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
