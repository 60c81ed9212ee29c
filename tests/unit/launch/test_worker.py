"""ddp_launch.worker: the workload runs as `python -m MOD` / `python SCRIPT` would, armed to
die with its launcher; a missing module or script is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ddp_launch.worker import PARENT_PID_VARIABLE, parent_already_gone

PROBE = textwrap.dedent(
    """
    import ctypes, json, os, signal, sys
    deathsig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(deathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
    print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "deathsig": deathsig.value,
                      "parent_var": os.environ.get("DDP_LAUNCH_AGENT_PID")}))
    """
)


def run_worker(tmp_path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in (PARENT_PID_VARIABLE, "RANK")}
    return subprocess.run([sys.executable, "-m", "ddp_launch.worker", *argv], cwd=tmp_path,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=60)


def test_a_script_runs_as_python_script_would_with_the_death_signal_armed(tmp_path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "probe.py").write_text(PROBE)
    done = run_worker(tmp_path, "scripts/probe.py", "--lr", "0.1")
    seen = json.loads(done.stdout)
    assert seen["name"] == "__main__"
    assert seen["argv"] == ["scripts/probe.py", "--lr", "0.1"]
    assert seen["path0"] == str(scripts)  # the script's directory, as `python scripts/probe.py` has it
    assert seen["deathsig"] == 15         # SIGTERM: the trainer checkpoints on it


def test_a_module_runs_as_python_m_would(tmp_path):
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(PROBE)
    done = run_worker(tmp_path, "-m", "probe_pkg", "--epochs", "2")
    seen = json.loads(done.stdout)
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(package / "__main__.py"), "--epochs", "2"]
    assert seen["path0"] == str(tmp_path)  # -m puts the working directory first
    assert seen["deathsig"] == 15


def test_the_workload_exit_code_and_traceback_pass_through_unchanged(tmp_path):
    (tmp_path / "fails.py").write_text("import sys\nsys.exit(75)\n")
    (tmp_path / "raises.py").write_text("raise ValueError('boom')\n")
    assert run_worker(tmp_path, "fails.py").returncode == 75
    crashed = run_worker(tmp_path, "raises.py")
    assert crashed.returncode == 1 and "ValueError: boom" in crashed.stderr


def test_the_parent_pid_variable_is_not_passed_on_to_the_workload(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    done = run_worker(tmp_path, "probe.py", env={PARENT_PID_VARIABLE: str(os.getpid())})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["parent_var"] is None


def test_a_worker_whose_launcher_died_before_it_was_armed_does_not_run(tmp_path):
    (tmp_path / "probe.py").write_text("open('ran', 'w').close()\n")
    done = run_worker(tmp_path, "probe.py", env={PARENT_PID_VARIABLE: "1"})  # our parent is not PID 1
    assert done.returncode == 1
    assert done.stderr == ("ddp-launch: error: the launcher (pid 1) exited before this worker started: "
                           "not running the workload\n")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("expected, parent, gone", [
    (None, 1, False),       # no launcher named (slurm-task: ddp-launch exec'd the worker itself)
    ("", 1, False),
    ("4242", 4242, False),  # still the launcher
    ("4242", 1, True),      # reparented to init: the launcher is gone
    ("4242", 977, True),    # reparented to a subreaper
    ("x", 1, False),        # not a PID: nothing to compare
])
def test_parent_already_gone_compares_the_launchers_pid_with_the_parent(expected, parent, gone):
    assert parent_already_gone(expected, parent) is gone


@pytest.mark.parametrize("argv, message", [
    (["-m", "no_such_module_xyz"], "no Python module named 'no_such_module_xyz' (--module)"),
    (["-m", "no_such_package_xyz.sub"], "no Python module named 'no_such_package_xyz.sub'"),
    (["missing.py"], "--script 'missing.py' is not a file on this node"),
    ([], "usage: python -m ddp_launch.worker"),
])
def test_a_workload_that_is_not_there_is_one_line_and_exit_2(tmp_path, argv, message):
    done = run_worker(tmp_path, *argv)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"ddp-launch: error: {message}")


def test_only_global_rank_0_prints_the_missing_workload_line(tmp_path):
    done = run_worker(tmp_path, "-m", "no_such_module_xyz", env={"RANK": "3"})
    assert (done.returncode, done.stderr) == (2, "")


# What finalization would have done and a script relies on, and a mark of finalization itself: an object
# whose __del__ runs when the interpreter clears the __main__ module at exit.
AT_EXIT = textwrap.dedent(
    """
    import atexit, os, sys, threading, time, types
    if "--torch" in sys.argv:
        sys.modules.setdefault("torch", types.ModuleType("torch"))  # what leave() looks for: torch imported
    class Finalized:
        def __del__(self):
            os.write(1, b"finalized\\n")
    sys.modules["__main__"].finalized_mark = Finalized()
    def late():
        time.sleep(0.3)
        print("thread done", flush=False)
    threading.Thread(target=late).start()
    atexit.register(lambda: print("atexit ran", flush=False))
    print("script done", flush=False)
    code = sys.argv[-1]
    sys.exit(None if code == "none" else int(code) if code.isdigit() else code)
    """
)


@pytest.mark.parametrize("code, status", [("0", 0), ("none", 0), ("75", 75), ("stopped early", 1)])
def test_a_script_that_imported_torch_leaves_past_finalization_with_its_threads_atexit_and_status(
        tmp_path, code, status):
    """The worker leaves with os._exit where torch was imported: gloo's threads can abort the interpreter's
    finalization (https://github.com/pytorch/pytorch/pull/179291). What a script relies on still happens,
    in the interpreter's order: its non-daemon threads end, its atexit functions run, its output is flushed,
    and its sys.exit() status is the process's (sys.exit in the Python library reference)."""
    (tmp_path / "ends.py").write_text(AT_EXIT)
    done = run_worker(tmp_path, "ends.py", "--torch", code)
    assert done.returncode == status, done.stderr
    assert done.stdout == "script done\nthread done\natexit ran\n"
    assert done.stderr == ("stopped early\n" if status == 1 else "")
    plain = run_worker(tmp_path, "ends.py", code)  # no torch: the interpreter's own exit, finalization included
    assert plain.returncode == status, plain.stderr
    assert plain.stdout == "script done\nthread done\natexit ran\nfinalized\n"
