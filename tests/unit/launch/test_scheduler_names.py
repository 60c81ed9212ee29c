"""Scheduler variable names live in the scheduler modules, nowhere else.

A new scheduler is one module in ddp_launch/schedulers/: that holds only while no other module
reads a scheduler's variables by name. What the others need from a scheduler they get from its
module (schedulers.Scheduler: GPU_GRANT, NODE_NAME, HELP, identity()) or, in the trainer and the
job library, from what the launcher exports (DDP_JOB_ID, DDP_NODE_NAME: ddp_launch/job_identity.py).

The rule, read from the source (ast), over every Python file of entrypoints/ and src/ outside
ddp_launch/schedulers/:
  - no string literal may name a SLURM_*, SLURMD_*, RUNAI_*, PET_* or KUBERNETES_* variable, f-strings'
    text included: a literal is what code reads or writes (env.get, a table), and a message that
    names a variable is raised by the module that reads it;
  - docstrings and comments may: they document behaviour and steer nothing. Advice that names a
    scheduler or its tools (RunAI's --command, srun, sbatch) names no variable and is not touched;
  - the job scripts (slurm/, runai/, kubeflow/) are not Python and are outside the rule: they are
    the scheduler's side of the launch;
  - the contract's host modules (entrypoints/host-modules.txt) are inside it. They run on the host's
    python3 (3.6), which cannot import the launcher, so the one that must read a scheduler's variable
    before any launch (ddp_contract/spares.py, run by the SLURM job script) declares it itself and is
    listed in ALLOWED with that name alone. Each entry of ALLOWED allows its names and no others.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SOURCES = (REPO / "entrypoints", REPO / "src")
SCHEDULERS = REPO / "entrypoints" / "ddp_launch" / "schedulers"
# Each file outside SCHEDULERS that may name scheduler variables: which, and why.
ALLOWED = {
    "entrypoints/ddp_launch/torchrun_command.py": (
        {"PET_RDZV_CONF"},
        "PET_RDZV_CONF is torchrun's own variable (torch.distributed.run reads each flag from "
        "PET_<FLAG>), passed on in every mode, not a scheduler's"),
    "entrypoints/ddp_launch/fabric/defaults.py": (
        {"SLURM_NETWORK"},
        "srun's own input, not the job's: srun reads SLURM_NETWORK as --network (srun(1), INPUT "
        "ENVIRONMENT VARIABLES), slurm/lib/ddp.sh sets it from the site profile, and the fabric's "
        "documented condition (fi_cxi(7), FI_CXI_RDZV_PROTO) is that option"),
    "entrypoints/ddp_contract/spares.py": (
        {"SLURM_JOB_NUM_NODES"},
        "a host module the SLURM job script runs (slurm/lib/ddp.sh) before any launch, on the host's "
        "python3 3.6, which cannot import the scheduler modules"),
    "entrypoints/ddp_contract/place.py": (
        {"KUBERNETES_SERVICE_HOST"},
        "where this process runs picks a fix's words (a pod or a cluster node) for the launcher, the "
        "trainer and the host alike; Kubernetes is the platform under RunAI and Kubeflow, not a scheduler module"),
    "entrypoints/ddp_contract/roll_call.py": (
        {"SLURMD_NODENAME"},
        "a trainer or a user's script started without ddp-launch (srun python -m ddp_train) has no "
        "DDP_NODE_NAME and still names its node as SLURM does; neither can import the launcher"),
}
SCHEDULER_NAME = re.compile(r"(?<![A-Za-z0-9_])(?:SLURMD?|RUNAI|PET|KUBERNETES)_[A-Z][A-Z0-9_]*")


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
    return sorted(path for root in SOURCES for path in root.rglob("*.py") if SCHEDULERS not in path.parents)


def test_no_module_outside_the_schedulers_names_a_scheduler_variable():
    found = []
    for path in python_files():
        allowed = ALLOWED.get(str(path.relative_to(REPO)), (set(), ""))[0]
        found += [f"{path.relative_to(REPO)}:{line}: {text!r}" for line, text in scheduler_names_in(path.read_text())
                  if set(SCHEDULER_NAME.findall(text)) - allowed]
    assert not found, ("scheduler variable names outside ddp_launch/schedulers/ (declare them in the "
                       "scheduler's module and ask it):\n" + "\n".join(found))


def test_every_allowed_file_exists_and_still_needs_each_of_its_names():
    for name, (allowed, _) in ALLOWED.items():
        named = {found for _, text in scheduler_names_in((REPO / name).read_text())
                 for found in SCHEDULER_NAME.findall(text)}
        assert named == allowed, f"{name} names {sorted(named)}, ALLOWED lists {sorted(allowed)}: update the entry"


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
    assert scheduler_names_in('x = "KUBERNETES_SERVICE_HOST"') == [(1, "KUBERNETES_SERVICE_HOST")]
