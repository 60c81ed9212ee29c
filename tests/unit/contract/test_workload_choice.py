"""Which workload a launch runs, read once from a job's (or pod's) arguments and DDP_LAUNCH_ARGS's words:
the built-in trainer, or the user's script or module with exactly its own arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_contract.errors import LaunchError
from ddp_contract.workload_choice import BUILTIN, MODULE, SCRIPT, Choice, choose, script_problem, with_absolute_script

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("launch", "args", "expected"), [
    # The built-in trainer: the arguments are its flags, DDP_LAUNCH_ARGS's words stay ddp-launch's.
    ((), ("--epochs", "3"), Choice(BUILTIN, "", (), ("--epochs", "3"))),
    (("--max-restarts", "2"), (), Choice(BUILTIN, "", ("--max-restarts", "2"), ())),
    # Named first: every later word is the workload's, a --module or --script of its own included.
    ((), ("--script", "train.py", "--module", "resnet", "--script=x"),
     Choice(SCRIPT, "train.py", (), ("--module", "resnet", "--script=x"))),
    ((), ("--module=pkg.train", "--lr", "1"), Choice(MODULE, "pkg.train", (), ("--lr", "1"))),
    # Named in DDP_LAUNCH_ARGS: taken out of ddp-launch's words, and all the arguments are the workload's.
    (("--max-restarts", "1", "--script", "t.py", "--nccl-debug", "INFO"), ("--x",),
     Choice(SCRIPT, "t.py", ("--max-restarts", "1", "--nccl-debug", "INFO"), ("--x",))),
    # --module ddp_train is the built-in trainer by its name.
    ((), ("--module", "ddp_train", "--epochs", "1"), Choice(BUILTIN, "", (), ("--epochs", "1"))),
])
def test_the_workload_and_its_arguments_are_read_from_the_first_words(launch, args, expected):
    assert choose(launch, args) == expected


@pytest.mark.parametrize(("launch", "args", "message"), [
    (("--script", "a.py", "--module", "m"), (),
     "DDP_LAUNCH_ARGS names 2 workloads (--script a.py, --module m): give one, --script PATH or --module MOD"),
    (("--module", "m"), ("--script", "a.py"),
     "the workload is named twice, in DDP_LAUNCH_ARGS (--module m) and in the arguments (--script a.py): name it "
     "once, as the first arguments (--script PATH ARGS...)"),
    ((), ("--epochs", "1", "--script", "a.py"),
     "--script comes after other arguments (--epochs 1): name the workload first, as --script PATH ARGS... (the "
     "arguments after it are all the workload's)"),
    ((), ("--script",), "--script needs a value: --script PATH for your script, --module MOD for a module"),
    ((), ("--module=",), "--module= is empty: give --module a value"),
])
def test_a_workload_named_twice_late_or_without_a_value_is_one_line(launch, args, message):
    with pytest.raises(LaunchError) as raised:
        choose(launch, args)
    assert str(raised.value) == message


def test_a_script_is_made_absolute_from_where_the_job_was_submitted(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("pass\n")
    chosen = with_absolute_script(choose((), ("--script", "code/../code/train.py", "-v")), str(tmp_path), {})
    assert chosen == Choice(SCRIPT, str(tmp_path / "code" / "train.py"), (), ("-v",))
    assert with_absolute_script(choose((), ("--module", "m")), "/nowhere", {}).target == "m"


def test_a_script_that_is_not_here_or_not_readable_names_the_fix_for_where_this_runs(tmp_path, monkeypatch):
    host = os.uname()[1].split(".")[0]
    assert script_problem("no.py", str(tmp_path), {}) == (
        f"--script no.py is not a file on {host} ({tmp_path}/no.py): give the path of your training script, "
        f"relative to the directory you submit from or absolute")
    in_a_pod = script_problem("/mnt/code/no.py", "/opt/ddp", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert in_a_pod.endswith("put the script on a claim they mount (the run or data claim of runai/submit.sh, a "
                             "volume of the Kubeflow manifest) or in the image, and give its path in the pod")
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert script_problem("train.py", str(tmp_path), {}) is None
    # access(2) as a user without the read bit answers so (root reads everything, so it is asked here).
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert script_problem("train.py", str(tmp_path), {}) == (
        f"--script train.py is not readable by you (uid {os.getuid()}): make it readable (chmod u+r {script})")


def run_choice(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The job scripts' call, with the host's python3 and the checkout's entrypoints."""
    return subprocess.run(["python3", "-m", "ddp_contract.workload_choice", *argv], cwd=cwd, capture_output=True,
                          env={"PYTHONPATH": str(REPO / "entrypoints"), "PATH": "/usr/bin:/bin"}, timeout=60)


def test_the_host_command_prints_the_choice_as_nul_terminated_words_and_errors_as_one_line(tmp_path):
    (tmp_path / "train.py").write_text("pass\n")
    done = run_choice("--check-file", "ddp", "2", "--max-restarts", "1", "--script", "train.py", "a b", "",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(b"\0") == [b"script", str(tmp_path / "train.py").encode(), b"2", b"--max-restarts",
                                        b"1", b"a b", b"", b"", b""]
    refused = run_choice("ddp", "0", "--epochs", "1", "--module", "m", cwd=tmp_path)
    assert (refused.returncode, refused.stdout) == (2, b"")
    assert refused.stderr.decode().count("\n") == 1 and refused.stderr.startswith(b"ddp: error: --module comes after")
