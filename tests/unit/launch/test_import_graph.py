"""The launcher's modules import each other one way only: no module is part of an import cycle.

Read from the source (ast), so an import under `if TYPE_CHECKING:` counts too: a cycle there
is still two modules that each need the other to be understood.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ddp_launch

PACKAGE = Path(ddp_launch.__file__).parent


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports by name (`from pkg import mod` names pkg.mod)."""
    modules = module_names()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                             for a in node.names)
        graph[name] = {edge for edge in edges if edge in modules and edge != name}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated last), or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        for imported in sorted(graph[name]):
            if imported in path:
                return path[path.index(imported):] + [imported]
            if imported not in done:
                found = visit(imported, path + [imported])
                if found:
                    return found
        done.add(name)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_no_launcher_module_is_part_of_an_import_cycle():
    assert cycle_in(import_graph()) is None, " -> ".join(cycle_in(import_graph()))


def test_a_cycle_is_found_where_there_is_one():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None


# The trainer runs inside torchrun without the launcher's help, and the contract on the host's
# Python 3.6: what they share with the launcher lives in ddp_contract, never the other way round.
REPO = PACKAGE.parents[1]
APART_FROM_THE_LAUNCHER = (REPO / "src" / "ddp_train", REPO / "entrypoints" / "ddp_contract")


def imported_packages(source: str) -> set[str]:
    """The top-level packages source imports, under any condition or inside any function."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_neither_the_trainer_nor_the_contract_imports_the_launcher():
    found = [str(path.relative_to(REPO)) for root in APART_FROM_THE_LAUNCHER for path in sorted(root.rglob("*.py"))
             if "ddp_launch" in imported_packages(path.read_text())]
    assert not found, f"these import ddp_launch (move what they need to ddp_contract): {', '.join(found)}"


def test_an_import_of_the_launcher_is_found_inside_a_function_too():
    assert "ddp_launch" in imported_packages("def f():\n    from ddp_launch.sites import load_site\n")
    assert "ddp_launch" in imported_packages("import ddp_launch.errors\n")
    assert imported_packages("from ddp_contract import sites\n") == {"ddp_contract"}
