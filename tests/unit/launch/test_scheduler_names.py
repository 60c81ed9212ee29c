"""Scheduler variable names live in the scheduler modules (and the contract's few), nowhere else.

A new scheduler is one module in ddp_launch/schedulers/: that holds only while no other module
reads a scheduler's variables by name. The rule, read from the source (ast): outside the allowed
files, no string literal may name a SLURM_*, SLURMD_*, RUNAI_* or PET_* variable, f-strings'
text included. Docstrings and comments may: they document behaviour and steer nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SOURCES = (REPO / "entrypoints", REPO / "src")
SCHEDULERS = REPO / "entrypoints" / "ddp_launch" / "schedulers"
# Each file outside SCHEDULERS that may name scheduler variables, and why.
ALLOWED = {
    "entrypoints/ddp_contract/scheduler_names.py":
        "the names the trainer's roll call and gpus.py need; neither can import the scheduler "
        "modules, which build their own tables on these",
    "entrypoints/ddp_launch/torchrun_command.py":
        "PET_RDZV_CONF is torchrun's own variable (torch.distributed.run reads each flag from "
        "PET_<FLAG>), passed on in every mode, not a scheduler's",
}
SCHEDULER_NAME = re.compile(r"(?<![A-Za-z0-9_])(?:SLURMD?|RUNAI|PET)_[A-Z]")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def scheduler_names_in(source: str) -> list[tuple[int, str]]:
    """(line, literal) for every string literal, not a docstring, that names a scheduler variable."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and SCHEDULER_NAME.search(node.value)]


def python_files() -> list[Path]:
    return sorted(path for root in SOURCES for path in root.rglob("*.py")
                  if SCHEDULERS not in path.parents and str(path.relative_to(REPO)) not in ALLOWED)


def test_no_module_outside_the_schedulers_names_a_scheduler_variable():
    found = [f"{path.relative_to(REPO)}:{line}: {text!r}"
             for path in python_files() for line, text in scheduler_names_in(path.read_text())]
    assert not found, ("scheduler variable names outside ddp_launch/schedulers/ (declare them in the "
                       "scheduler's module and ask it):\n" + "\n".join(found))


def test_every_allowed_file_exists_and_still_needs_its_exception():
    for name in ALLOWED:
        assert scheduler_names_in((REPO / name).read_text()), f"{name} names no scheduler variable: drop it from ALLOWED"


def test_a_name_in_code_or_an_f_string_is_found_and_one_in_a_docstring_or_comment_is_not():
    source = '''"""Reads SLURM_JOB_ID."""
def job(env):
    """PET_NNODES too."""
    # RUNAI_JOB_NAME as well
    return env.get("SLURM_JOB_ID") or f"{env}: $RUNAI_NUM_OF_GPUS"
'''
    assert [line for line, _ in scheduler_names_in(source)] == [5, 5]
    assert scheduler_names_in('x = "MY_SLURM_HOME, PETS_, DDP_JOB_ID"') == []
    assert scheduler_names_in('x = "SLURMD_NODENAME"') == [(1, "SLURMD_NODENAME")]
