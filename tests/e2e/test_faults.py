"""Failures on the real cluster: a node's workers die, a node never joins, a stop signal."""
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (LONG, TWO_A_NODE, Cluster, midrun, checkpointed, sbatch_args, epochs_done, metrics_records,
                      training_started)

pytestmark = pytest.mark.e2e

# A run that a fault ends after its first epoch, never its own end (conftest's midrun).
LONG_RUN = midrun(30, "--checkpoint-every 1")



def _wait_for_epochs(cluster, run_dir: Path, count: int, timeout: float = 600) -> None:
    # Before the first epoch: the image's start on every node and the rendezvous, which under load
    # have taken over a minute.
    cluster.wait_for_file(run_dir, timeout, predicate=lambda d: epochs_done(d) >= count)


def _kill_trainers(cluster, node: str) -> list[str]:
    """SIGKILL the trainer processes (torchrun's workers) in one node's namespace."""
    pids = subprocess.run(["ip", "netns", "pids", cluster.netns(node)], capture_output=True, text=True).stdout.split()
    killed = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        # Workers run `python -u -m ddp_launch.worker -m ddp_train`; the agent is ddp_launch.agent.
        is_agent = any(arg in (b"ddp_launch.agent", b"torch.distributed.run") for arg in cmdline)
        if b"ddp_train" in cmdline and not is_agent:
            subprocess.run(["kill", "-KILL", pid])
            killed.append(pid)
    return killed


def _node_processes(cluster: Cluster, node: str) -> list[tuple[str, list[bytes]]]:
    pids = subprocess.run(["ip", "netns", "pids", cluster.netns(node)], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            found.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")))
        except FileNotFoundError:
            continue
    return found


def _workers_on(cluster: Cluster, node: str) -> list[str]:
    return [pid for pid, cmdline in _node_processes(cluster, node)
            if b"ddp_launch.worker" in cmdline and b"ddp_launch.agent" not in cmdline]


@LONG
def test_a_node_whose_launcher_and_workers_are_sigkilled_is_kept_and_the_job_fails_137(cluster, job_env, tmp_path):
    # The OOM killer takes a node's ddp-launch and its workers (they die with it: PR_SET_PDEATHSIG,
    # tests/unit/launch/test_launch_outcomes.py): every rank of node2 falls silent at once, and node1's
    # roll call names node2 as a lost node would be named. But node2's slurmd answers: the job script
    # keeps it, and the job fails with srun's 137 for the killed task, not a requeue without a healthy
    # node (a seeded soak of 2-node jobs showed that requeue). DDP_STEP_WAIT: srun would end the step
    # 120 s after the first task; the roll call (15 s) ends node1's ranks well before.
    job_env = {**job_env, **LONG_RUN, "DDP_STEP_WAIT": "120"}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)
    _wait_for_epochs(cluster, run_dir, 1)
    workers = _workers_on(cluster, "node2")
    assert len(workers) == 1

    agents = [pid for pid, cmdline in _node_processes(cluster, "node2") if b"ddp_launch.agent" in cmdline]
    assert len(agents) == 1, agents
    subprocess.run(["kill", "-KILL", agents[0], *workers], check=True)

    job = cluster.wait(job_id, timeout=240)
    output = job.output()
    assert (job.state, job.exit_code, job.fields.get("Restarts")) == ("FAILED", "137:0", "0"), output
    assert re.search(r"lost contact with node2 \(rank 1\)", output), output  # the roll call's view
    assert "node2 is up: its slurmd answered after the step failed" in output, output
    assert "excluded node2" not in output and not (run_dir / "quarantine.json").exists()
    assert "ddp: job failed with exit status 137 (128 + SIGKILL: a task was killed" in output, output


@LONG
def test_killed_workers_on_one_node_fail_the_job_quickly_naming_the_rank(cluster, job_env, tmp_path):
    job_env = {**job_env, **LONG_RUN}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)
    _wait_for_epochs(cluster, run_dir, 1)

    assert _kill_trainers(cluster, "node2"), "no trainer process found on node2"
    killed_at = time.monotonic()
    job = cluster.wait(job_id, timeout=90)

    assert time.monotonic() - killed_at < 90
    output = job.output()
    assert job.state == "FAILED", output
    assert job.exit_code != "0:0"
    assert re.search(r"ddp-launch: error: worker rank 1 on \S+ was killed by SIGKILL \(crash\)", output), output
    assert "job failed with exit status 1; per-rank logs are in" in output  # ddp.sh's last line: a crash (1)


@LONG
def test_with_max_restarts_torchrun_restarts_and_the_trainer_resumes(cluster, job_env, tmp_path):
    # Two epochs after the first checkpoint: the kill lands within a poll of the save (checkpointed imports
    # torch before the job starts), and the restart trains what is left.
    job_env = {**job_env, **midrun(3, "--checkpoint-every 1"), "DDP_LAUNCH_ARGS": "--max-restarts 1"}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    one_saved = checkpointed(1)
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)
    cluster.wait_for_file(run_dir, 600, predicate=one_saved)

    assert _kill_trainers(cluster, "node2")
    job = cluster.wait(job_id, timeout=600)

    assert job.state == "COMPLETED", job.output()
    starts = [r for r in metrics_records(run_dir) if r["type"] == "run"]
    assert len(starts) == 2
    assert starts[1]["resumed_from_epoch"] >= 1
    assert [r for r in metrics_records(run_dir) if r["type"] == "summary"][-1]["world_size"] == 2


def _launch_with_one_launcher_missing(cluster, tmp_path, missing_node: int, rdzv_timeout_s: int):
    """srun over both nodes where node `missing_node` never starts ddp-launch; (result, seconds taken)."""
    script = tmp_path / "one-launcher-missing.sh"
    script.write_text(f"#!/bin/bash\nif [ \"$SLURM_NODEID\" = {missing_node} ]; then sleep 300; fi\n"
                      "exec ddp-launch --cpu-workers 1 --script tests/e2e/workloads/allreduce.py\n")
    script.chmod(0o755)
    started = time.monotonic()
    done = cluster.run(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", str(script)],
                       env={"DDP_LAUNCH_RDZV_TIMEOUT": str(rdzv_timeout_s)}, timeout=150)
    return done, time.monotonic() - started


def test_a_rendezvous_that_never_completes_times_out_with_a_clear_message(cluster, tmp_path):
    # Node 2 never starts its launcher: node 1 waits for a peer that never comes.
    done, seconds = _launch_with_one_launcher_missing(cluster, tmp_path, missing_node=1, rdzv_timeout_s=15)

    assert done.returncode != 0
    assert seconds < 90
    assert f"ddp-launch: error: rendezvous at {cluster.address('node1')}:" in done.stderr
    assert "timed out before all 2 node(s) joined" in done.stderr


def test_a_node_whose_head_never_starts_gives_up_within_the_rendezvous_timeout(cluster, tmp_path):
    # The head (node 0) never starts its launcher: node 1 keeps connecting to a port where
    # nothing listens. Its wait was bounded by a 300 s store timeout, twice, not by the
    # rendezvous timeout, and ended in C++ stack traces.
    done, seconds = _launch_with_one_launcher_missing(cluster, tmp_path, missing_node=0, rdzv_timeout_s=10)

    assert done.returncode != 0
    assert seconds < 60
    assert f"ddp-launch: error: rendezvous store at {cluster.address('node1')}:" in done.stderr
    assert "frame #" not in done.stderr and "Traceback" not in done.stderr


# USR2: what our scripts ask SLURM for before the time limit, on the batch shell alone
# (--signal=B:USR2@120; by hand `scancel --batch --signal=USR2`, scancel(1)): its trap passes
# the stop on through the run dir, and no process of the step is signalled, so the job runs
# on unprivileged Apptainer's squashfuse mount as on a cluster (the job array's test below).
# TERM: preemption, and clusters that only ever send TERM: SLURM signals every process of the
# job's steps (scancel(1) --signal), and squashfuse_ll, which serves the image, is one of
# them: TERM unmounts it, and the workers die of SIGBUS on their next page of the image before
# any checkpoint. APPTAINER_UNSQUASH=1 (`apptainer run --unsquash`: the SIF unpacked to a
# temporary sandbox) leaves nothing to kill. Every step unpacks the whole image again; job_env
# runs the training step alone (no preflight, no gate), so each start unpacks it once.
UNSQUASHED = {"APPTAINER_UNSQUASH": "1"}
# A stop test's run: five epochs of about 4 s on a quiet machine (conftest's midrun), the stop sent as soon as
# it trains. The stop lands within about 8 s: USR2 goes scancel -> slurmctld -> the batch shell's trap -> the
# request file, which rank 0 reads at most every 5 s (signals.REQUEST_POLL_S), and the ranks vote every 2 steps
# (of 8 an epoch). Under load the epochs slow down with everything else, the 5 s do not: the quiet machine is
# the tight case. Whatever the stop leaves, the requeued run trains (a test of ten epochs stopped after the
# first trained nine more: most of its CPU-seconds, spent on nothing the test asserts).
STOP_RUN = midrun(5, "--stop-check-every 2")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def assert_stopped_requeued_and_resumed(job, run_dir: Path, signal_name: str) -> None:
    """job, stopped by signal_name, checkpointed, requeued once and resumed from its checkpoint to its end."""
    records = metrics_records(run_dir)
    kinds = [r["type"] for r in records]
    assert job.state == "COMPLETED", job.output()
    assert [r["signal"] for r in records if r["type"] == "stopped"] == [signal_name], records
    resumed = [r for r in records if r["type"] == "run"][1:]
    assert resumed and resumed[0]["resumed_from_epoch"] is not None
    assert kinds[-1] == "summary"
    assert job.fields.get("Restarts") == "1"
    # One .out for both runs (--open-mode=append): the stop, then the requeued run to its summary.
    output = job.output()
    assert output.index("(restart 0)") < output.index(f"Stop requested ({signal_name}") < output.index("(restart 1)"), output


@LONG
def test_a_term_stop_checkpoints_and_the_requeued_job_resumes_and_finishes(cluster, job_env, tmp_path):
    # One node: TERM reaches every process of the step on each node alike (the array's test below stops a
    # 2-node run, its vote crossing the nodes). Two workers: TERM reaches each, and they agree on the stop.
    job_env = {**job_env, **TWO_A_NODE, **UNSQUASHED, **STOP_RUN}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    job_id = cluster.sbatch([*sbatch_args(tmp_path, "--nodes=1"), "slurm/olivia-multinode.sh"], env=job_env)
    cluster.wait_for_file(run_dir, 600, predicate=training_started)

    cluster.run(["scancel", "--signal=TERM", job_id], timeout=30)
    # Two starts of the image (TERM unpacks it each time): under a load of 18 on this machine's 2 cores a
    # requeued run of six epochs was still training when 300 s ran out.
    job = cluster.wait(job_id, timeout=600, states=ENDED)

    assert_stopped_requeued_and_resumed(job, run_dir, "SIGTERM")


@LONG
def test_a_usr2_stop_in_a_job_array_requeues_that_task_alone_which_resumes_and_each_task_has_its_own_run_dir(
        cluster, job_env, tmp_path):
    # sbatch --array=0-1: two 2-node tasks side by side, each in its own run dir named with %A_%a as
    # sbatch --output names files. Task 0's SLURM_JOB_ID is the array's, and scontrol given that id
    # requeues every task (Lightning-AI/pytorch-lightning#15022): the stop must requeue <array>_0 alone.
    cluster.needs_nodes(4)
    job_env = {**job_env, "DDP_RUN_DIR": str(tmp_path / "sweep-%A_%a"), **STOP_RUN}
    array = cluster.sbatch([*sbatch_args(tmp_path, "--array=0-1"), "slurm/olivia-multinode.sh"], env=job_env)
    tasks = [f"{array}_{index}" for index in (0, 1)]
    run_dirs = [tmp_path / f"sweep-{task}" for task in tasks]
    cluster.wait_for_file(run_dirs[0], 600, predicate=training_started)

    cluster.run(["scancel", "--batch", "--signal=USR2", tasks[0]], timeout=30)
    # Task 0 runs twice (its restart starts the image and the rendezvous again) beside task 1: in CI, beside
    # the unit suite and the other e2e worker, its epochs took 33 s and 300 s ran out in its restart.
    done = [cluster.wait(task, timeout=600, states=ENDED) for task in tasks]

    assert_stopped_requeued_and_resumed(done[0], run_dirs[0], "SIGUSR2")
    # Only the batch shell got it: without its trap that shell dies and the job FAILs.
    output = done[0].output()
    assert "ddp: SIGUSR2 reached the batch script: asked the training step to checkpoint and stop" in output
    assert not (run_dirs[0] / ".ddp-stop-request").exists()
    assert f"requeuing job {tasks[0]} (restart 1 of 3)" in output
    assert (done[1].state, done[1].fields.get("Restarts")) == ("COMPLETED", "0"), done[1].output()
    assert [r for r in metrics_records(run_dirs[1]) if r["type"] == "stopped"] == []
    assert metrics_records(run_dirs[1])[-1]["type"] == "summary"


def test_under_squashfuse_a_stop_signal_kills_the_image_mount_and_the_workers_die_of_sigbus(cluster, job_env,
                                                                                            tmp_path):
    # Why the scripts ask for B:USR2, the TERM test above sets APPTAINER_UNSQUASH=1, and the doctor
    # warns about squashfuse: USR2 sent to every process of the step (no --batch) kills squashfuse_ll.
    # The 0.25 model without a sleeping rank: the workers keep computing, and paging, as the mount goes.
    job_env = {**job_env, "DDP_TRAIN_ARGS": "--epochs 30 --batch-size 64 --width-scale 0.25 --allow-unverified-data "
                                           "--checkpoint-every 1"}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)
    _wait_for_epochs(cluster, run_dir, 1)

    cluster.run(["scancel", "--signal=USR2", job_id], timeout=30)
    job = cluster.wait(job_id, timeout=120)

    output = job.output()
    assert job.state == "FAILED", output
    assert re.search(r"ddp-launch: error: worker rank \d on \S+ was killed by SIGBUS", output), output
    # Whether rank 0 got its stop record out before the mount went is a race; the job's end is not:
    # a failure, never requeued.
    assert job.fields.get("Restarts") == "0", job.fields
