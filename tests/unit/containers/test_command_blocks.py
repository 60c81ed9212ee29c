"""Every command block of the documentation runs as written where it can run here, or says why not.

A reader copies a block whole, so each runs whole, `bash -euo pipefail -c BLOCK`, in the place a
reader runs it:
- CHECKOUT: the repository root with `make venv` done, `.venv/bin` first on PATH;
- FRESH_MACHINE: a copy of the checkout with its `.venv` and the system's PATH (the set-up commands,
  whose runs and data land where they are run);
- LOGIN_NODE: the repository root with the system python3 and no `.venv`, as on a cluster's login
  node (Python 3.6 or newer, standard library only), where the cluster's tools are stand-ins
  (tests/stand_ins/: sbatch, module, kubectl, make's dry run for the targets that build images or
  download; tests/bats/stubs/runai for the RunAI CLI) that take only what their tools document.
A block that goes on from an earlier one (a job it continues) runs after it, in the same place and
state, as a reader runs the page from top to bottom (Run.after).
A block another test runs whole is in RUN_ELSEWHERE, with that test; a block that cannot run here is
in NOT_HERE, with the reason. A block in none of the three fails the test, and so does an entry whose
block is gone. Output and file contents are fenced `text`, `json`, `jsonc` or `yaml` and not run.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import documented_blocks
import pytest
from definitions_paths import REPO
from documented_blocks import Block

STAND_INS = REPO / "tests" / "stand_ins"
RUNAI_STAND_IN = REPO / "tests" / "bats" / "stubs" / "runai"
VENV_BIN = Path(sys.executable).parent
# The stand-ins that record each call, and the commands of a block that reach them.
RECORDING_STAND_INS = ("sbatch", "make", "module", "kubectl")
SYSTEM_PATH = "/usr/bin:/bin"

CHECKOUT, FRESH_MACHINE, LOGIN_NODE = "checkout", "fresh machine", "login node"


@dataclass(frozen=True)
class Run:
    place: str
    expect: tuple = ()                          # what the output (stdout and stderr) must contain
    fill: dict = field(default_factory=dict)    # placeholders, filled as the text above the block says
    after: tuple = ()                           # HOW keys of the blocks run before it, in its state


@dataclass(frozen=True)
class RunElsewhere:
    test: str                                   # the test that runs the block whole: FILE::NAME
    blocks: Callable[[], list]                  # the blocks that test runs, as it finds them


@dataclass(frozen=True)
class NotHere:
    reason: str


def _runai_readme_blocks() -> list:
    from test_runai_readme import runai_block
    return [runai_block()]


def _own_script_apptainer_blocks() -> list:
    return [documented_blocks.own_script_apptainer_block().text]


def _site_doctor_blocks() -> list:
    from test_documented_commands import site_doctor_commands
    return [block for _, block, _ in site_doctor_commands() if block]


# The RCP quick start's placeholders, as test_runai_readme fills the RunAI block's.
RUNAI_PLACEHOLDERS = {"<project>": "mlo", "<user>": "alice", "<tag>": "v1", "<uid>": "224954", "<gid>": "83070"}
TRAINER_V2_QUICK_START = ("README.md", "kubectl apply -f kubeflow/trainingruntime.yaml")
SITE_DOCTOR = RunElsewhere("tests/unit/containers/test_documented_commands.py::"
                           "test_a_documented_doctor_command_for_a_site_runs_as_written_with_its_binds",
                           _site_doctor_blocks)

# (page, the block's first command line) -> how it runs.
HOW = {
    ("README.md", "make build-olivia"): Run(LOGIN_NODE),
    ("README.md", "module load apptainer"): Run(LOGIN_NODE),
    ("README.md", "make data"): Run(LOGIN_NODE),
    ("README.md", "make build-x86"): Run(LOGIN_NODE),
    ("README.md", "export RUNAI_IMAGE=ic-registry.epfl.ch/<project>/ddp-train:<tag>"): Run(
        LOGIN_NODE, expect=("runai/submit.sh: staging CIFAR-100 into /mloscratch/homes/alice/data",
                            "runai/submit.sh: a new run, ddp-train-"), fill=RUNAI_PLACEHOLDERS),
    ("README.md", "kubectl create -f kubeflow/pytorchjob.yaml"): Run(
        LOGIN_NODE, expect=("kubectl stand-in: logs of ddp-train-",),
        fill={"<job>": '"$(head -n 1 "${KUBECTL_STAND_IN_STATE}/jobs")"'}),
    TRAINER_V2_QUICK_START: Run(
        LOGIN_NODE, expect=("trainingruntime.trainer.kubeflow.org/ddp-train created", "kubectl stand-in: logs of ddp-train-"),
        fill={"<job>": '"$(head -n 1 "${KUBECTL_STAND_IN_STATE}/jobs")"'}),
    # The TrainJob the quick start created is <job>, in single quotes in the block's sed expression.
    ("README.md", "sed -e 's/{name: DDP_RESUME_RUN, value: \"\"}/{name: DDP_RESUME_RUN, value: <job>}/' -e "
                  "'s/\"--epochs\", \"50\"/\"--epochs\", \"80\"/' \\"): Run(
        LOGIN_NODE, expect=("trainjob.trainer.kubeflow.org/ddp-train-",), after=(TRAINER_V2_QUICK_START,),
        fill={"<job>": "'\"$(head -n 1 \"${KUBECTL_STAND_IN_STATE}/jobs\")\"'"}),
    ("README.md", "make demo"): Run(FRESH_MACHINE, expect=("Training completed successfully.",)),
    ("README.md", "make test"): NotHere("the whole suite, this test among them: CI runs it on a clean clone (.ci/run)"),
    ("README.md", ".venv/bin/ddp-launch --dry-run --mode local --cpu-workers 2 -- --epochs 3"): Run(
        CHECKOUT, expect=("mode: local", "--nproc-per-node=2", "-m ddp_train --epochs 3")),
    ("README.md", "sbatch slurm/olivia-multinode.sh --epochs 5 --batch-size 1024"): Run(LOGIN_NODE),
    ("README.md", "sbatch --account=nn1234k slurm/olivia-1gpu.sh --script examples/argparse_torchrun.py --steps 200"):
        Run(LOGIN_NODE),
    ("README.md", "export RUNAI_IMAGE=ic-registry.epfl.ch/<project>/ddp-train:<tag> RUNAI_RUN_AS=<uid>:<gid>"):
        Run(LOGIN_NODE, expect=("runai/submit.sh: a new run, ddp-train-",), fill=RUNAI_PLACEHOLDERS),
    ("README.md", "sed 's|args: \\[\"--epochs\", \"50\"\\]|args: [\"--script\", \"/mnt/runs/code/env_ranks.py\", "
                  "\"--steps\", \"200\"]|' kubeflow/pytorchjob.yaml | kubectl create -f -"):
        Run(LOGIN_NODE, expect=("pytorchjob.kubeflow.org/ddp-train-",)),
    ("README.md", ".venv/bin/ddp-launch --mode local --cpu-workers 2 --script examples/argparse_torchrun.py -- --steps 40"):
        Run(FRESH_MACHINE, expect=("world size 2, backend gloo, steps 0-39", "done: 40 steps")),
    ("README.md", "apptainer run train-cpu.sif --mode local --cpu-workers 2 --script examples/argparse_torchrun.py -- "
                  "--steps 40"): RunElsewhere(
        "tests/e2e/test_own_script.py::test_the_readme_runs_ones_own_script_in_apptainer_by_hand_as_written",
        _own_script_apptainer_blocks),
    ("docs/own-script.md", 'apptainer exec train-x86_64.sif python3 -m venv --system-site-packages --without-pip "$HOME/venvs/ddp"'):
        NotHere("an x86_64 cluster's login node with Apptainer, pip's index and SLURM; "
                "tests/e2e/test_own_script.py::test_a_venv_made_in_the_image_adds_a_package_the_workers_import runs "
                "the same three steps in the image, with a wheel of its own in place of the index"),
    ("README.md", "DDP_SPARE_NODES=1 sbatch --nodes=3 slurm/olivia-multinode.sh"): Run(LOGIN_NODE),
    ("README.md", "docker login ic-registry.epfl.ch"): RunElsewhere(
        "tests/unit/containers/test_runai_readme.py::test_the_block_runs_as_written_and_resumes_the_run_it_submitted",
        _runai_readme_blocks),
    ("README.md", 'export APPTAINER_BIND="$(PYTHONPATH=entrypoints python3 -m ddp_launch.binds --site olivia)"'):
        SITE_DOCTOR,
    ("README.md", "srun --account=nn0000k --partition=accel --nodes=1 --ntasks=1 --gpus=1 --time=00:10:00 \\"):
        NotHere("an Olivia accel node with the arm64 image, after the Olivia jobs (runs/olivia-*, a job's id in "
                "place of <job>); tests/e2e/test_twin_olivia.py::test_olivia_ddp_bench_report_runs_in_the_image_"
                "on_a_compute_node_as_documented runs its srun and apptainer exec on the twin, over the twin's runs"),
    ("containers/README.md",
     'export APPTAINER_BIND="$(PYTHONPATH=entrypoints python3 -m ddp_launch.binds --site olivia)"'): NotHere(
        "an Olivia compute node in an allocation: srun, the GPU image train.sif and Olivia's host libraries, "
        "which the binds name; test_documented_commands holds its srun and GPU flags to the job scripts'"),
    ("containers/README.md",
     "PYTHONPATH=entrypoints python3 -m ddp_launch.accelerators --site lumi apptainer-flag"): Run(
        LOGIN_NODE, expect=("--rocm\n", "nvidia-smi\n")),
    ("containers/README.md",
     'export SINGULARITY_BIND="$(PYTHONPATH=entrypoints python3 -m ddp_launch.binds --site lumi)"'): SITE_DOCTOR,
    ("docs/benchmarks.md", "python benchmarks/trainer_throughput.py"): NotHere(
        "a benchmark of minutes of CPU (make bench runs it), whose second line needs a GPU: benchmarks "
        "print figures side by side and are not tests (docs/testing.md)"),
    ("docs/benchmarks.md",
     "python benchmarks/trainer_throughput.py --forensics-only --forensics-repeats 2 --train-images 1024"): NotHere(
        "a benchmark of minutes of CPU (interleaved pairs of 2-worker runs): benchmarks print figures, "
        "they are not tests"),
    ("docs/benchmarks.md",
     "python benchmarks/trainer_throughput.py --device cuda --width-scale 1 --batch-size 256 --workers 8"): NotHere(
        "needs a GPU (--device cuda)"),
    ("docs/benchmarks.md", "python benchmarks/gpu_throughput.py --variants graphs,coop-reductions,"
                           "no-split-reductions,conv1x1-mm,pdl,combo-kernels"): NotHere(
        "needs a GPU: CUDA graphs and the compiler's GPU levers, minutes of tuning"),
    ("docs/benchmarks.md", "GPU_CHECK_BUDGET_S=540 OUT=gpu-check-h100 benchmarks/gpu_node_check.sh bn-fp16"): NotHere(
        "a GPU session on an H100 and an H200: the GPU tests, kernels and trainer runs it times need the card"),
    ("docs/benchmarks.md",
     "python -m pytest -q -rs -k on_the_gpu tests/unit/train/test_loss_scale.py tests/unit/train/test_triton_bn.py"):
        NotHere("the steps of the GPU session above, each on the GPU (-k on_the_gpu selects the tests that skip "
                "without one; the unit suite runs those files here)"),
    ("docs/reliability.md", "DDP_SPARE_NODES=1 sbatch --nodes=3 slurm/olivia-multinode.sh"): Run(LOGIN_NODE),
    ("docs/troubleshooting.md", "apptainer exec --nv train.sif ddp-launch doctor"): NotHere(
        "a GPU compute node, then a 2-node allocation (srun -N2), with the image train.sif"),
}


def first_command(block: Block) -> str:
    """The block's first line that is not a comment, without its own comment (from " #"), its spaces
    collapsed: what names the block in HOW, whatever its line number and its comments' wording."""
    for line in block.text.splitlines():
        words = line.split(" #", 1)[0].split()
        if words and not words[0].startswith("#"):
            return " ".join(words)
    return ""


def key(block: Block) -> tuple:
    return (block.doc, first_command(block))


BLOCKS = documented_blocks.command_blocks()


def test_every_command_block_is_run_or_has_a_reason():
    keys = [key(block) for block in BLOCKS]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    assert not repeated, f"blocks that begin alike cannot be told apart in HOW: reword one of {repeated}"
    unlisted = [f"{block}: {first_command(block)!r}" for block in BLOCKS if key(block) not in HOW]
    assert not unlisted, ("a command block that this test neither runs nor excuses: add it to HOW, as a Run "
                          f"where it can run here, else NotHere with the reason: {unlisted}")
    gone = sorted(set(HOW) - set(keys))
    assert not gone, f"HOW names blocks the docs no longer have (remove them): {gone}"


def test_every_fence_says_whether_it_is_a_command():
    unknown = [f"{block} ```{block.info}" for doc in documented_blocks.documentation()
               for block in documented_blocks.blocks(doc)
               if block.info not in documented_blocks.SHELLS | documented_blocks.NOT_COMMANDS]
    assert not unknown, f"fence commands with none or bash, output and file contents with text, json or yaml: {unknown}"


def stand_in_commands(text: str) -> list:
    """The commands of a block that reach a recording stand-in, in order (the first word after any
    VAR=value words of each command of a line: a pipeline's or a list's too)."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():  # a line continued with \ is one command
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
        lexer.whitespace_split = True
        tokens = list(lexer)
        starts = [0] + [i + 1 for i, token in enumerate(tokens) if token in ("|", "||", "&&", ";")]
        for start in starts:
            words = tokens[start:]
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]
            if words and words[0] in RECORDING_STAND_INS:
                commands.append(words[0])
    return commands


def stand_in_bin(tmp_path: Path) -> Path:
    """A directory of the stand-ins, each run by this test's Python (the venv's, with PyYAML and the
    packages the sbatch stand-in asks)."""
    bin_dir = tmp_path / "stand-ins"
    bin_dir.mkdir()
    for tool in RECORDING_STAND_INS:
        (bin_dir / tool).write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STAND_INS / tool}.py" "$@"\n')
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "runai").symlink_to(RUNAI_STAND_IN)
    return bin_dir


def fresh_copy(tmp_path: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) in a copy, with the checkout's .venv."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    copy = tmp_path / "checkout"
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    (copy / ".venv").symlink_to(REPO / ".venv")
    # make would rebuild an outdated venv from the copy, pointing its editable install there.
    assert subprocess.run(["make", "-q", ".venv/.installed"], cwd=copy).returncode == 0, \
        "the venv is older than pyproject.toml: run make venv"
    return copy


def filled(block: Block, run: Run) -> str:
    text = block.text
    for placeholder, value in run.fill.items():
        text = text.replace(placeholder, value)
    return text


def earlier(run: Run) -> str:
    """The text of the blocks run goes on from, each filled as its own Run says."""
    blocks = {key(block): block for block in BLOCKS}
    return "".join(filled(blocks[name], HOW[name]) for name in run.after)


def run_block(block: Block, run: Run, tmp_path: Path) -> tuple:
    """(the finished bash, the stand-ins' recorded calls) of block run whole where run says."""
    text = earlier(run) + filled(block, run)
    home = tmp_path / "home"
    home.mkdir(parents=True)
    env = {"HOME": str(home), "USER": "alice", "LANG": "C.UTF-8", "STAND_IN_CALLS": str(tmp_path / "calls.jsonl"),
           "REAL_MAKE": shutil.which("make"), "KUBECTL_STAND_IN_STATE": str(tmp_path / "kubectl"),
           "RUNAI_FAKE_CLI": "v1", "RUNAI_FAKE_STATE": str(tmp_path / "runai")}
    stand_ins = stand_in_bin(tmp_path)
    cwd = REPO
    if run.place == CHECKOUT:
        env["PATH"] = f"{VENV_BIN}:{SYSTEM_PATH}"
    elif run.place == LOGIN_NODE:
        env["PATH"] = f"{stand_ins}:{SYSTEM_PATH}"
    else:
        env["PATH"] = SYSTEM_PATH
        cwd = fresh_copy(tmp_path)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    calls = tmp_path / "calls.jsonl"
    return done, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


RUNS = [(block, HOW[key(block)]) for block in BLOCKS if isinstance(HOW.get(key(block)), Run)]


@pytest.mark.parametrize("block, run", RUNS, ids=[str(block) for block, _ in RUNS])
def test_a_block_runs_as_written_where_it_can_run_here(block, run, tmp_path):
    done, calls = run_block(block, run, tmp_path)

    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{block}, run as written in the {run.place}, failed:\n{output}"
    if run.place == LOGIN_NODE:
        assert [call["tool"] for call in calls] == stand_in_commands(earlier(run) + block.text), (calls, output)
    missing = [text for text in run.expect if text not in output]
    assert not missing, f"{block}: the output lacks {missing}:\n{output}"


ELSEWHERE = [(block, HOW[key(block)]) for block in BLOCKS if isinstance(HOW.get(key(block)), RunElsewhere)]


@pytest.mark.parametrize("block, elsewhere", ELSEWHERE, ids=[str(block) for block, _ in ELSEWHERE])
def test_a_block_run_by_another_test_is_one_that_test_runs(block, elsewhere):
    path, name = elsewhere.test.split("::")
    assert name in (REPO / path).read_text(), f"{elsewhere.test} is gone"
    assert block.text in elsewhere.blocks(), f"{block} is not among the blocks {elsewhere.test} runs"


def test_a_stand_in_refuses_what_its_tool_would(tmp_path):
    # The runs above prove only as much as the stand-ins refuse: each of these fails as it would on
    # the cluster (an option sbatch(1) lacks, a script that is not there, a misspelt DDP_ variable, a
    # trainer flag ddp-train lacks, a make target the Makefile lacks, a PyTorchJob's log before its create).
    wrong = ["sbatch --acount=nn1234k slurm/olivia-multinode.sh", "sbatch slurm/olivia-multinode.bash",
             "DDP_SPARE_NODE=1 sbatch --nodes=3 slurm/olivia-multinode.sh",
             "sbatch slurm/olivia-multinode.sh --epoch 5", "DDP_LAUNCH_ARGS='--max-restart 2' sbatch slurm/raven-1gpu.sh",
             "sbatch slurm/olivia-1gpu.sh --script examples/no_such_script.py",
             "make build-raven", "module avail", "kubectl apply -f kubeflow/pytorchjob.yaml",
             "kubectl logs -f -l training.kubeflow.org/job-name=ddp-train-x"]
    for number, line in enumerate(wrong):
        block = Block("README.md", 1, "", line + "\n", ())
        done, calls = run_block(block, Run(LOGIN_NODE), tmp_path / str(number))
        assert done.returncode != 0 and not calls, (line, done.stdout, done.stderr)


SET_UP = "Set-up on a fresh machine"
QUICK_START_CLUSTERS = {"Olivia", "Raven", "LUMI-G", "An Ethernet cluster", "RCP (RunAI)", "Kubeflow Trainer v2",
                        "Kubeflow PyTorchJob"}


def test_the_readme_opens_with_the_local_try_out_then_a_quick_start_that_runs_here_for_each_cluster():
    # A newcomer's first runnable command is the demo on their own machine, before any cluster's block.
    sections = [line[3:] for line in documented_blocks.README.read_text().splitlines() if line.startswith("## ")]
    assert sections[:2] == [SET_UP, documented_blocks.QUICK_START], f"the README's first sections are {sections[:2]}"
    first = documented_blocks.blocks(documented_blocks.README)[0]
    assert (first.headings[-1:], first.text) == ((SET_UP,), "make demo\n"), first
    starts = documented_blocks.quick_starts()
    assert set(starts) == QUICK_START_CLUSTERS
    not_run = [cluster for cluster, block in starts.items() if not isinstance(HOW.get(key(block)), Run)]
    assert not not_run, f"a quick start that this test does not run: {not_run}"


def test_the_set_up_is_the_two_commands_and_ci_runs_the_second():
    setup = [block.text for block in documented_blocks.blocks(documented_blocks.README)
             if block.headings[-1:] == (SET_UP,)]
    assert setup == ["make demo\n", "make test\n"]
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test", ci


def test_each_slurm_quick_start_has_a_twin():
    # Its twin submits the quick start's sbatch line word for word (tests/e2e/conftest.py,
    # twin_script_job and submit_quick_start); the block's run above checks it against the script.
    slurm = {cluster for cluster, block in documented_blocks.quick_starts().items()
             if documented_blocks.sbatch_lines(block)}
    assert slurm == set(documented_blocks.QUICK_START_TWINS)
    for twin in documented_blocks.QUICK_START_TWINS.values():
        assert (REPO / "tests" / "e2e" / "cluster" / "twins" / f"{twin}.sh").is_file(), twin


def test_each_twin_submits_the_own_script_quick_start_of_its_cluster():
    # The README's own-script SLURM block has one sbatch line per cluster with a twin, which that twin submits
    # word for word (tests/e2e/conftest.py, own_script_job); each line runs an example of examples/.
    (block,) = documented_blocks.own_script_blocks(documented_blocks.OWN_SCRIPT_SLURM)
    lines = documented_blocks.sbatch_lines(block)
    twins = sorted(documented_blocks.QUICK_START_TWINS.values())
    assert sorted(Path(documented_blocks.own_script_job_script(twin)).name.split("-")[0] for twin in twins) == twins
    assert len(lines) == len(twins)
    for line in lines:
        assert line.args[0] == "--script" and (REPO / line.args[1]).is_file() and line.args[1].startswith("examples/")
