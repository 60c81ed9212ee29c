"""The launcher's modules import each other one way only: no module is part of an import cycle;
nor are the trainer's (its rooms, safety/ and gate/, included), the contract's or ddp-bench's.

Read from the source (ast), so an import under `if TYPE_CHECKING:` counts too: a cycle there
is still two modules that each need the other to be understood.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ddp_bench
import ddp_contract
import ddp_launch
import ddp_train
import pytest

PACKAGE = Path(ddp_launch.__file__).parent


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    names = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package modules it imports by name (`from pkg import mod` names pkg.mod)."""
    modules = module_names(package)
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


OTHER_PACKAGES = {module.__name__: Path(module.__file__).parent for module in (ddp_train, ddp_bench, ddp_contract)}


@pytest.mark.parametrize("name", sorted(OTHER_PACKAGES))
def test_no_module_of_the_other_packages_is_part_of_an_import_cycle(name):
    graph = import_graph(OTHER_PACKAGES[name])
    assert cycle_in(graph) is None, " -> ".join(cycle_in(graph))


def test_the_trainers_rooms_are_read_as_modules_of_their_own():
    graph = import_graph(OTHER_PACKAGES["ddp_train"])
    assert {"ddp_train.safety.heartbeat", "ddp_train.gate.judge", "ddp_train.gate.run"} <= set(graph)
    assert "ddp_train.gate.judge" in graph["ddp_train.gate.run"]  # `from ddp_train.gate.judge import ...`
    assert "ddp_train.safety.rundir" in graph["ddp_train.train"]  # `from ddp_train.safety import rundir`


def test_the_trainers_rooms_import_nothing_on_entry():
    """`ddp_train.safety` and `ddp_train.gate` only name their modules: ddp-bench loads gate.judge without
    torch, which gate.run and the safety nets import."""
    rooms = [OTHER_PACKAGES["ddp_train"] / room / "__init__.py" for room in ("safety", "gate")]
    assert [imported_packages(room.read_text()) for room in rooms] == [set(), set()]


def test_the_speed_code_and_the_recipe_each_have_a_room_that_imports_nothing_on_entry():
    """fast/ holds the GPU speed code and recipe/ what trains; config.py reads fast.levers without torch."""
    graph = import_graph(OTHER_PACKAGES["ddp_train"])
    fast = ("speed", "levers", "cudagraph_report", "fused_blocks", "cudnn_blocks", "bn_kernels", "bn_blocks",
            "loss_scale")
    recipe = ("model", "learner", "data", "evaluate")
    assert {f"ddp_train.fast.{name}" for name in fast} | {f"ddp_train.recipe.{name}" for name in recipe} <= set(graph)
    assert not {f"ddp_train.{name}" for name in fast + recipe} & set(graph)  # none left flat beside them
    rooms = [OTHER_PACKAGES["ddp_train"] / room / "__init__.py" for room in ("fast", "recipe")]
    assert [imported_packages(room.read_text()) for room in rooms] == [set(), set()]


def test_the_contracts_commands_live_in_its_main_not_in_the_package_its_modules_import():
    """`python3 -m ddp_contract download DIR` needs ddp_contract.download, which needs the package: the
    dispatch in the package itself made package -> download -> package."""
    graph = import_graph(OTHER_PACKAGES["ddp_contract"])
    assert "ddp_contract.download" in graph["ddp_contract.__main__"]
    assert "ddp_contract" in graph["ddp_contract.download"]


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


# Tests, benchmarks and the containers' scripts import the packages as installed (`make venv`:
# pip install -e .) and their neighbours through pyproject.toml's pytest pythonpath, a script's own
# directory (Python puts it first on sys.path) or PYTHONPATH, never by editing sys.path.
PATH_EDIT = re.compile(r"sys\.path\s*(\.(insert|append|extend)\(|\[[^]]*:[^]]*\]\s*=|\+=)")


def test_nothing_outside_the_packages_edits_sys_path():
    found = [f"{path.relative_to(REPO)}:{number}"
             for folder in ("tests", "benchmarks", "containers") for path in sorted((REPO / folder).rglob("*"))
             if path.suffix in (".py", ".bats", ".sh") and path != Path(__file__)
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if PATH_EDIT.search(line)]
    assert not found, f"these edit sys.path (set PYTHONPATH, or rely on pytest's pythonpath): {', '.join(found)}"


def test_an_edit_of_sys_path_is_found_in_each_of_its_spellings():
    for line in ("sys.path.insert(0, here)", "sys.path[:0] = [src]", "sys.path.append(x)", "sys.path += [x]"):
        assert PATH_EDIT.search(line), line
    assert not PATH_EDIT.search('print(sys.path[0])') and not PATH_EDIT.search("first on sys.path")
