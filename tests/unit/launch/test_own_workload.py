"""The user's own script or module as a first-class workload of ddp-launch: its plan, its worker, its
venv, the doctor's and the pods' preflight checks of it; and, with the real torchrun, ranks that agree
whichever variables a script reads, and a MASTER_PORT of its own that works."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddp_launch import venv
from ddp_launch.doctor.cli import run as doctor_run
from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts
from ddp_launch.planner import script_refusal
from ddp_launch.preflight import PodLaunch, doctor_argv
from ddp_launch.launch_options import Workload
from launch_envs import env_of, olivia, plan_for, raven, runai


def clean_env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_", "DDP_"))}
    return {**env, "HOME": str(tmp_path), **extra}


# -- the plan -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "argv"), [
    (olivia(0), ()), ({}, ("--mode", "local", "--cpu-workers", "2")), (runai(1), ()),
], ids=["slurm-node", "local", "kubeflow"])
def test_a_users_workload_under_torchrun_gets_a_store_of_rank_0s_own_ours_the_shared_one(env, argv):
    """torchrun shares its store with the workers (TORCHELASTIC_USE_AGENT_STORE=True), and env:// then makes
    every rank a client at MASTER_ADDR:MASTER_PORT: a script that sets its own MASTER_PORT would wait for a
    store nobody hosts. The trainer's plan (the golden files) is unchanged."""
    script = env_of(plan_for(env, *argv, "--script", "train.py"))
    assert script["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env_of(plan_for(env, *argv))
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env_of(plan_for(env, *argv, "--module", "ddp_train.gate"))
    # A user's own value stays.
    kept = env_of(plan_for({**env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}, *argv, "--script", "train.py"))
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in kept


def test_a_task_bound_to_one_gpu_runs_our_trainer_with_its_device_but_stops_a_users_script_in_one_line():
    bound = raven(5, CUDA_VISIBLE_DEVICES="1")
    assert env_of(plan_for(bound))["DDP_TASK_DEVICE"] == "0"
    with pytest.raises(LaunchError) as refused:
        plan_for(bound, "--script", "train.py")
    assert str(refused.value) == (
        "task 1 of this node sees one GPU (CUDA_VISIBLE_DEVICES=1), its own, as device 0, while its LOCAL_RANK and "
        "SLURM_LOCALID are 1 of 4: a script that picks its GPU from them (cuda:LOCAL_RANK) would not find it "
        "(--script train.py); give every task the node's GPUs (--gpus-per-node=4 or --gres=gpu:4, without "
        "--gpus-per-task or --gpu-bind), as this project's job scripts ask")
    # Every task sees the node's GPUs: LOCAL_RANK is the device, the script's plan goes ahead.
    assert env_of(plan_for(raven(6, CUDA_VISIBLE_DEVICES="0,1,2,3"), "--script", "train.py"))["LOCAL_RANK"] == "2"


def test_a_script_the_node_cannot_see_names_the_bind_in_a_container_and_the_claim_in_a_pod():
    facts = NodeFacts(cwd="/home/me")
    assert script_refusal("train.py", facts, {}) == (
        "--script 'train.py' is not a file here (/home/me/train.py; relative paths are taken from /home/me): give "
        "the path of your Python file")
    container = script_refusal("/cluster/projects/nn1/train.py", facts, {"APPTAINER_CONTAINER": "/x/train.sif"})
    assert container.endswith(
        "the container (/x/train.sif) does not see it: if it is on the host, bind the directory that holds it "
        "(APPTAINER_BIND=/cluster/projects/nn1, which the job scripts pass on; Apptainer binds only $HOME, the "
        "working directory, /tmp, /var/tmp and the binds named)")
    lumi = script_refusal("/project/p1/train.py", facts, {"SINGULARITY_CONTAINER": "/x/lumi.sif"})
    assert "(SINGULARITY_BIND=/project/p1, " in lumi
    pod = script_refusal("/mnt/code/train.py", facts, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert pod.endswith("put the script on a claim they mount (the run or data claim of runai/submit.sh, a volume "
                        "of the Kubeflow manifest) or in the image, and give its path in the pod")
    unreadable = script_refusal("t.py", NodeFacts(existing_files=frozenset({"t.py"})), {})
    assert unreadable.startswith("--script 't.py' is not readable by uid ")


# -- DDP_VENV ---------------------------------------------------------------------------------------------

def make_venv(where: Path, system_site_packages: bool = True) -> Path:
    flags = ["--system-site-packages"] if system_site_packages else []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(where)], check=True, timeout=120)
    return where


def test_ddp_venv_runs_the_launcher_torchrun_and_every_worker_in_the_venvs_python(tmp_path):
    made = make_venv(tmp_path / "venv")
    # A venv made here sees the system's site-packages, not this checkout's .venv: the checkout's packages
    # come by PYTHONPATH, as an image's come from its own site-packages.
    checkout = Path(__file__).resolve().parents[3]
    env = clean_env(tmp_path, DDP_VENV=str(made), PYTHONPATH=f"{checkout / 'entrypoints'}:{checkout / 'src'}")
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--dry-run", "--json", "--mode", "local",
                           "--cpu-workers", "1", "--", "--epochs", "1"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["argv"][:3] == [str(made / "bin" / "python"), "-m", "ddp_launch.agent"]


def test_a_ddp_venv_that_is_none_here_or_hides_the_images_packages_is_one_line_with_how_to_make_it(tmp_path):
    with pytest.raises(LaunchError, match=r"^DDP_VENV=/nowhere is not a virtual environment here \(no "
                                          r"/nowhere/pyvenv.cfg; a container sees only what is bound into it\): make "
                                          r"it in the image, apptainer exec IMAGE python3 -m venv "
                                          r"--system-site-packages --without-pip /nowhere"):
        venv.interpreter({"DDP_VENV": "/nowhere"})
    closed = make_venv(tmp_path / "closed", system_site_packages=False)
    with pytest.raises(LaunchError, match="does not see the image's packages .* include-system-site-packages = false"):
        venv.interpreter({"DDP_VENV": str(closed)})
    made = make_venv(tmp_path / "venv")
    assert venv.interpreter({"DDP_VENV": str(made)}) == str(made / "bin" / "python")
    assert venv.interpreter({"DDP_VENV": str(made)}, prefix=str(made)) is None  # running in it already
    assert venv.interpreter({}) is None


# -- the doctor and the pods' preflight --------------------------------------------------------------------

def doctor_checks(capsys, *argv: str) -> dict:
    code = doctor_run(["--json", "--offline", *argv], clean_env(Path("/tmp")), sys.stdout)
    checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    return {"code": code, **checks}


def test_the_doctor_checks_the_users_script_or_module_and_leaves_cifar_to_the_trainer(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    found = doctor_checks(capsys, "--script", str(script), "--data-dir", str(tmp_path / "none"))
    assert (found["workload"]["status"], found["workload"]["detail"]) == ("OK", f"script {script} is readable here")
    assert found["dataset"]["status"] == "SKIP"
    missing = doctor_checks(capsys, "--script", str(tmp_path / "absent.py"))
    assert missing["code"] == 1 and missing["workload"]["status"] == "FAIL"
    assert missing["workload"]["detail"].startswith(f"--script '{tmp_path}/absent.py' is not a file here")
    module = doctor_checks(capsys, "--module", "no_such_package.train")
    assert module["workload"]["status"] == "FAIL" and "no Python module named 'no_such_package.train'" in \
        module["workload"]["detail"]
    trainer = doctor_checks(capsys, "--data-dir", str(tmp_path / "none"))
    assert trainer["workload"]["status"] == "OK" and trainer["dataset"]["status"] == "WARN"


def test_the_pods_doctor_is_told_the_workload_and_needs_no_data_dir_for_it():
    pod = PodLaunch((), (), None, "", 600.0, "job", "pod-0", Workload(module=None, script="/mnt/runs/code/t.py"))
    assert doctor_argv(pod, None, "rcp")[3:] == ["doctor", "--json", "--site", "rcp", "--script", "/mnt/runs/code/t.py"]
    trainer = PodLaunch((), (), None, "", 600.0, "job", "pod-0")
    assert doctor_argv(trainer, "/mnt/data", None)[3:] == ["doctor", "--json", "--data-dir", "/mnt/data"]


# -- with the real torchrun --------------------------------------------------------------------------------

SHOW_RANKS = textwrap.dedent("""
    import json, os, sys
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID")
    with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"]), "w") as out:
        json.dump({key: os.environ.get(key) for key in keys}, out)
    """)


def test_torchrun_workers_under_slurm_read_their_own_ranks_from_slurms_variables_too(tmp_path):
    """One srun task of a 1-node job runs torchrun with 2 workers: each inherits SLURM_PROCID=0, SLURM_LOCALID=0,
    SLURM_NTASKS=1, so a script that takes its rank from them trained twice as rank 0 of 1."""
    script = tmp_path / "ranks.py"
    script.write_text(SHOW_RANKS)
    slurm = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_NODEID": "0",
             "SLURM_JOB_NODELIST": socket.gethostname(), "SLURM_JOB_NUM_NODES": "1"}
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", "2", "--script",
                           str(script), "--", str(tmp_path)], env=clean_env(tmp_path, **slurm), capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"rank-{rank}").read_text()) for rank in (0, 1)]
    assert seen == [{"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "SLURM_PROCID": str(rank),
                     "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2", "SLURM_NODEID": "0"} for rank in (0, 1)]


OWN_PORT = textwrap.dedent("""
    import datetime, os, sys
    import torch, torch.distributed as dist
    os.environ["MASTER_PORT"] = sys.argv[1]  # the script's own, as scripts written for srun set it
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    # One write a line: the ranks share the launcher's stdout, and under PYTHONUNBUFFERED print() writes
    # the text and its newline apart, so two ranks printing at once made "rank 0: sum 2rank 1: sum 2".
    sys.stdout.write(f"rank {dist.get_rank()}: sum {int(tensor.item())}\\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    """)


def test_a_script_that_sets_its_own_master_port_meets_at_it_under_torchrun(tmp_path):
    script = tmp_path / "own_port.py"
    script.write_text(OWN_PORT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", "2", "--script",
                           str(script), "--", str(port)], env=clean_env(tmp_path, DDP_RUN_DIR=str(tmp_path)),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank ")) == \
        ["rank 0: sum 2", "rank 1: sum 2"]
    # Rank 0's worker wrote what ran, the script's digest among it; the run dir's lock is released.
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["workload"]["script"] == str(script) and manifest["workload"]["args"] == [str(port)]
    assert len(manifest["workload"]["sha256"]) == 64 and "torch" in manifest["libraries"]
    assert manifest["environment"]["TORCH_FR_DUMP_TEMP_FILE"]["value"] == f"{tmp_path}/forensics/fr-trace-rank"
    assert not (tmp_path / ".ddp-run.lock").exists()


def test_a_users_workload_in_a_run_dir_another_live_job_holds_stops_in_one_line(tmp_path):
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('must not run in a run dir another job holds')\n")
    lock = {"job": "4711", "host": socket.gethostname(), "pid": os.getpid(), "pid_space": "", "since": 0}
    (tmp_path / ".ddp-run.lock").write_text(json.dumps(lock))
    done = subprocess.run([sys.executable, "-m", "ddp_launch.worker", str(script)],
                          env=clean_env(tmp_path, DDP_RUN_DIR=str(tmp_path), DDP_JOB_ID="42"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"ddp-launch: error: --run-dir {tmp_path} is in use by job 4711 on ")
    assert done.stderr.count("\n") == 1


LOSES_THE_HEAD = textwrap.dedent("""
    from ddp_contract import workload as ddp
    ddp._taking.hosts = ["node1", "node2"]  # what progress() gathered at its first call
    raise RuntimeError("Connection reset by peer")  # a collective failed: its store does not answer either
    """)


def test_a_failure_raised_out_of_a_script_that_took_part_gets_the_roll_call_in_one_line_not_a_traceback(tmp_path):
    script = tmp_path / "loses.py"
    script.write_text(LOSES_THE_HEAD)
    done = subprocess.run([sys.executable, "-m", "ddp_launch.worker", str(script)],
                          env=clean_env(tmp_path, DDP_RUN_DIR=str(tmp_path), RANK="1", WORLD_SIZE="2",
                                        MASTER_ADDR="node1", DDP_NODE_NAME="node2"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("ddp-launch: error: lost contact with the head node node1 (its rendezvous store "
                                  "does not answer) after a collective failed (Connection reset by peer)")
    assert "Traceback" not in done.stderr
    assert json.loads((tmp_path / "roll-call.json").read_text())["lost"] == [{"node": "node1", "ranks": [0]}]
