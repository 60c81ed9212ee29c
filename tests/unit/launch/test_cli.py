"""The edge: one-line errors with exit 2, --dry-run output, subcommand dispatch, and a real exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import pytest

from ddp_launch import cli
from launch_envs import olivia, raven

REPO = Path(__file__).resolve().parents[3]

PROBE = """\
import json, os, sys
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RUN_ID")
# One write of the whole line: two workers share the pipe, and print() may write the text and
# its newline separately (unbuffered), so lines of two ranks could run together.
os.write(1, (json.dumps({"argv": sys.argv[1:], "env": {n: os.environ.get(n) for n in names}}) + "\\n").encode())
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def run_main(argv, env, capsys):
    with mock.patch.dict(os.environ, env, clear=True):
        code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, env, message", [
    (["--mode", "fast"], {}, "--mode='fast' is not a mode: choose one of auto, torchrun, slurm-task"),
    ([], {"DDP_LAUNCH_MODE": "slurm"}, "DDP_LAUNCH_MODE='slurm' is not a mode"),
    (["--nodes", "two"], {}, "--nodes='two' is not a positive integer"),
    (["--nproc-per-node", "0"], {}, "--nproc-per-node='0' is not a positive integer"),
    ([], {"DDP_LAUNCH_CPU_WORKERS": "many"}, "DDP_LAUNCH_CPU_WORKERS='many' is not a positive integer"),
    (["--rdzv-port", "70000"], {}, "--rdzv-port='70000' is not a TCP port"),
    ([], {"DDP_LAUNCH_MAX_RESTARTS": "-1"}, "DDP_LAUNCH_MAX_RESTARTS='-1' is not an integer >= 0"),
    (["--rdzv-timeout", "0"], {}, "--rdzv-timeout='0' is not a positive integer"),
    ([], {"DDP_LAUNCH_RDZV_TIMEOUT": "1m"}, "DDP_LAUNCH_RDZV_TIMEOUT='1m' is not a positive integer"),
    (["--module", "m", "--script", "s.py"], {}, "argument --script: not allowed with argument --module"),
    (["--nproc-per-node", "2", "--cpu-workers", "2"], {}, "--nproc-per-node and --cpu-workers both"),
    (["--json"], {}, "--json only changes how --dry-run prints"),
    (["--epochs", "3"], {}, "unrecognized arguments: --epochs 3 (put workload arguments after --)"),
    (["--script", "no/such/file.py"], {}, "--script 'no/such/file.py' is not a file"),
    (["--dry-run"], {"SLURM_JOB_ID": "42"}, "SLURM_JOB_ID=42 is set but neither SLURM_STEP_NODELIST"),
    (["--dry-run"], {**olivia(0), "SLURM_STEP_NODELIST": "gh[1-2"}, "SLURM_STEP_NODELIST='gh[1-2' is not a valid SLURM hostlist"),
    (["--dry-run"], {**olivia(0), "SLURM_STEP_NUM_NODES": "2.0"}, "SLURM_STEP_NUM_NODES='2.0' is not a non-negative integer"),
    (["--dry-run", "--nodes", "3"], olivia(0), "--nodes 3 but SLURM gave this step 2 node(s)"),
])
def test_bad_input_is_one_line_exit_2_and_no_traceback(argv, env, message, capsys):
    code, out, err = run_main(argv, env, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("ddp-launch: error: ")
    assert message in err


def test_dry_run_prints_the_plan_and_exits_zero(capsys):
    code, out, _ = run_main(["--dry-run", "--rdzv-host", "10.10.0.1", "--", "--epochs", "1"], olivia(1), capsys)
    assert code == 0
    assert out.startswith("mode: slurm-node\ncommand: ")
    assert "--rdzv-endpoint=10.10.0.1:22340" in out and out.rstrip().split("\n")[1].endswith("-m ddp_train --epochs 1")


def test_dry_run_json_is_machine_readable(capsys):
    code, out, _ = run_main(["--dry-run", "--json", "--cpu-workers", "2"], {}, capsys)
    plan = json.loads(out)
    assert code == 0 and plan["mode"] == "local"
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in [{k: e[k] for k in ("name", "value")} for e in plan["env"]]


def test_fabric_changes_and_notes_are_part_of_the_printed_plan(capsys):
    from ddp_launch.plan import EnvChange
    seen = []

    def fake_fabric(request, facts, data):
        seen.append((request, facts, data))
        return types.SimpleNamespace(fabric="slingshot", notes=("kept NCCL_PROTO=LL from the user",),
                                     changes=(EnvChange("NCCL_SOCKET_IFNAME", "hsn0", "fabric: test"),),
                                     findings=())

    with mock.patch("ddp_launch.planner.plan_fabric", fake_fabric):
        code, out, _ = run_main(["--dry-run", "--rdzv-host", "10.10.0.1", "--site", "olivia",
                                 "--nccl-debug", "INFO", "--require-fabric", "--log-dir", "/scratch/logs"],
                                olivia(0), capsys)
    assert code == 0 and "NCCL_SOCKET_IFNAME=hsn0  # fabric: test" in out
    assert "note: kept NCCL_PROTO=LL from the user" in out
    request, facts, data = seen[0]
    assert (request.multi_node, data.profile.name, request.head_address, request.nccl_debug,
            request.require_fabric, request.log_dir) == (True, "olivia", "10.10.0.1", "INFO", True, "/scratch/logs")
    assert "DDP_LAUNCH_LOG_DIR" not in request.env  # the log dir is a field, not a fake variable
    assert facts.python == sys.executable  # the probed node, handed to the fabric as it is


def test_subcommands_dispatch_to_their_module(monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("ddp_launch.binds")
    fake.main = lambda argv: calls.append(argv) or 5
    monkeypatch.setitem(sys.modules, "ddp_launch.binds", fake)
    assert cli.main(["binds", "--site", "olivia"]) == 5
    assert calls == [["--site", "olivia"]]


def test_missing_subcommand_module_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ddp_launch.doctor", None)
    assert cli.main(["doctor"]) == 2
    assert capsys.readouterr().err.startswith("ddp-launch: error: the doctor subcommand")


# -- real processes ----------------------------------------------------------------------------

def launcher_env(extra):
    """A subprocess's environment. GPU grants are dropped: the launcher would ask this
    machine's CUDA driver (test_gpus.py covers that), and these tests are about the plan."""
    extra = {k: v for k, v in extra.items() if k not in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS")}
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO / "entrypoints"), **extra}


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return path


TRICKY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "*", "", "--", "ünï", "x;exit 3"]


def test_cli_module_dry_run_in_a_subprocess():
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--dry-run", "--rdzv-host", "10.10.0.1"],
                          env=launcher_env(olivia(0)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--rdzv-conf=is_host=true,read_timeout=300" in done.stdout


def test_the_launcher_plans_without_importing_torch():
    # torch takes seconds to import and may not even be importable where the launcher runs.
    code = ("import runpy, sys; sys.argv = ['ddp-launch', '--dry-run', '--rdzv-host', '10.10.0.1']\n"
            "try:\n    runpy.run_module('ddp_launch', run_name='__main__')\n"
            "except SystemExit:\n    print('torch imported:', 'torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], env=launcher_env(olivia(0)),
                          capture_output=True, text=True, timeout=60)
    assert "mode: slurm-node" in done.stdout, done.stderr
    assert done.stderr.strip() == "torch imported: False"


def test_cli_error_in_a_subprocess_has_no_traceback():
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--mode", "nope"],
                          env=launcher_env({}), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("ddp-launch: error: --mode='nope'")


def test_exec_passes_argv_byte_for_byte_and_the_exit_code_through(probe):
    env = launcher_env({"TORCHELASTIC_RUN_ID": "unit", "RANK": "1", "WORLD_SIZE": "2", "PROBE_EXIT": "7"})
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--script", str(probe), "--", *TRICKY],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert json.loads(done.stdout)["argv"] == TRICKY


def test_slurm_task_exec_gives_the_task_its_ranks(probe):
    env = launcher_env({**raven(6), "DDP_LAUNCH_RDZV_HOST": "10.20.0.123"})
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--script", str(probe), "--", "--x", "1"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["--x", "1"]
    assert seen["env"] == {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
                           "MASTER_ADDR": "10.20.0.123", "MASTER_PORT": "20170",
                           "CUDA_VISIBLE_DEVICES": None, "TORCHELASTIC_RUN_ID": None}


def test_real_torchrun_accepts_the_single_node_slurm_plan(probe):
    """The plan's torchrun flags (c10d, is_host, read_timeout) against torchrun itself: 2 CPU workers."""
    pytest.importorskip("torch", reason="torch is not installed in this interpreter")
    env = launcher_env({"SLURM_JOB_ID": "31337", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost",
                        "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_NODEID": "0"})
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--cpu-workers", "2", "--script", str(probe),
                           "--", "a b", "$X"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    workers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(w["env"]["RANK"] for w in workers) == ["0", "1"]
    assert {w["env"]["WORLD_SIZE"] for w in workers} == {"2"}
    assert all(w["argv"] == ["a b", "$X"] and w["env"]["CUDA_VISIBLE_DEVICES"] == "" for w in workers)


def test_a_launch_error_that_holds_a_line_break_is_still_printed_as_one_line(capsys):
    from ddp_launch import errors

    def main(argv):
        raise errors.LaunchError("DDP_RUN_DIR=/scratch/a\nb\u2028c is not writable: pick another")

    assert errors.run_main(main, []) == 2
    assert capsys.readouterr().err == "ddp-launch: error: DDP_RUN_DIR=/scratch/a\\nb\\u2028c is not writable: pick another\n"
