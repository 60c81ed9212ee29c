"""Faults a real cluster has: a node that drops off the network mid-job (the job requeued without it),
two jobs in one run dir, several jobs at once, a rendezvous port already taken on the head node. A node
that dies mid-job and a spare in its place: tests/e2e/test_spares.py."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import apptainer_root
from conftest import (LONG, TERMINAL_STATES, TRAIN_ARGS, TWO_A_NODE, WITH_CHECKS, checkpointed, metrics_records,
                      midrun, saved_epoch, sbatch_args, training_started)

from ddp_launch.rendezvous import rendezvous_port

pytestmark = pytest.mark.e2e

# Short collectives' timeout: a dropped node is noticed within it (--dist-timeout-s).
DIST_TIMEOUT_S = 30
# Four epochs (conftest's midrun): one before the fault, the rest the runway it lands on; the next run resumes
# from the checkpoint and trains what is left. The faults land within a poll of the save they wait for.
RUN = midrun(4, "--checkpoint-every 1", f"--dist-timeout-s {DIST_TIMEOUT_S}")
# The disk-full test's: the 0.25 model, whose checkpoint (8 MiB) does not fit in the 2 MiB it leaves free
# (the 0.125 model's, 2.2 MB, nearly would); its fault lands within the epoch after its second save.
DISK_RUN = (f"--epochs 4 --batch-size 64 --width-scale 0.25 --allow-unverified-data --checkpoint-every 1 "
            f"--dist-timeout-s {DIST_TIMEOUT_S}")



def requeued_or_ended(cluster, job_id: str) -> bool:
    job = cluster.job(job_id)
    return job.fields.get("Restarts") != "0" or job.state in TERMINAL_STATES


def revive(cluster, node: str) -> None:
    done = cluster.cluster_sh(["revive", node], timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def long_job_env(job_env):
    return {**job_env, **RUN}


def started_job(cluster, env, tmp_path, until=None, nodes: int = 2) -> tuple[str, Path]:
    """A job of env's run dir on `nodes` nodes, submitted and waited for until it has saved its first epoch
    (or until `until` holds of its run dir)."""
    run_dir = Path(env["DDP_RUN_DIR"])
    until = until or checkpointed(1)
    job_id = cluster.sbatch([*sbatch_args(tmp_path, f"--nodes={nodes}"), "slurm/olivia-multinode.sh"], env=env)
    cluster.wait_for_file(run_dir, 600, predicate=until)
    return job_id, run_dir


@LONG
def test_a_node_that_drops_off_the_network_is_named_and_the_job_requeued_without_it_resumes(
        cluster, long_job_env, tmp_path):
    job_id, run_dir = started_job(cluster, long_job_env, tmp_path)
    subprocess.run(["ip", "-n", cluster.netns("node2"), "link", "set", "eth0", "down"], check=True)
    dropped_at = time.monotonic()
    try:
        # node1's ranks wait out the collective timeout, then the roll call (peers.ROLL_CALL_S), then
        # srun's --wait for node2's tasks, which it cannot reach; then the batch script requeues the job.
        cluster.wait_for_file(run_dir, 480, predicate=lambda _: requeued_or_ended(cluster, job_id))
        print(f"the job was requeued {time.monotonic() - dropped_at:.0f} s after node2 dropped off "
              f"(collective timeout {DIST_TIMEOUT_S} s)")
        kept = saved_epoch(run_dir)
        assert kept >= 1
    finally:
        revive(cluster, "node2")
    job = cluster.wait(job_id, timeout=600)
    output = job.output()
    # A lost node is a bad node: with no spare (DDP_SPARE_NODES=0) the job script quarantines it and
    # requeues the job without it (exit 76, within DDP_MAX_REQUEUES), as for a node the preflight or the
    # gate names. The scripts' --no-kill keeps slurmctld from ending the job as NODE_FAIL and requeueing it
    # itself, onto the same node where it is not marked DOWN yet; the requeued run's step ids are new, so
    # srun's late kill of the lost node's step finds nothing (docs/reliability.md).
    assert (job.state, job.exit_code, job.fields.get("Restarts")) == ("COMPLETED", "0:0", "1"), output
    # Who names node2 first depends on the phase of slurmctld's pings: the ranks' roll call (the collective
    # timeout, then ROLL_CALL_S), or slurmctld ending the step once node2 misses its pings (SlurmdTimeout,
    # slurm.conf(5)), after which the job script reads sinfo's "not responding" (ddp::report_unheard_nodes).
    assert (re.search(r"ddp-train: error: lost contact with node2 \(rank 1\): no answer", output)
            or "the training step failed with no roll call, and slurmctld stopped hearing from the node" in output), output
    assert ("a node was lost mid-run and the job has no spare node (DDP_SPARE_NODES=0): requeuing without it, "
            "to resume from the last checkpoint (exit 76)") in output
    assert re.search(rf"ddp: bad node\(s\) node2: requeuing job {job_id} without them \(restart 1 of 3, exit 76\)",
                     output), output
    assert "Traceback" not in output
    assert job.fields["ExcNodeList"] == "node2" and "node2" not in cluster.job_nodes(job)
    excluded = json.loads((run_dir / "quarantine.json").read_text())["excluded"]
    assert [(e["node"], e["by"]) for e in excluded] == [("node2", "roll-call")]
    starts = [r for r in metrics_records(run_dir) if r["type"] == "run"]
    assert len(starts) == 2 and starts[-1]["resumed_from_epoch"] == kept
    assert "summary" in [r["type"] for r in metrics_records(run_dir)]


def running_step_ids(cluster, job_id: str) -> list[int]:
    """The ids of the job's numbered steps running now (squeue --steps), not its batch or extern step."""
    done = cluster.run(["squeue", "--steps", "--jobs", job_id, "--noheader", "--format=%i"], timeout=30)
    return sorted(int(step.split(".")[1]) for step in done.stdout.split() if re.fullmatch(rf"{job_id}\.\d+", step))


@LONG
def test_a_requeued_run_takes_none_of_its_predecessors_step_ids_so_their_late_kills_find_nothing(
        cluster, long_job_env, tmp_path):
    """A requeued job numbers its steps from 0 again, and a kill slurmctld could not deliver to a
    node off the network is retried every 60 s naming only the job and step id, until the node
    answers (src/slurmctld/job_mgr.c batch_requeue_fini, src/slurmctld/agent.c RPC_RETRY_INTERVAL).
    Here those late kills come on purpose, after the requeued run has started training. One node: the step ids
    are the job's, whatever its nodes."""
    job_id, run_dir = started_job(cluster, long_job_env, tmp_path, nodes=1)
    before = running_step_ids(cluster, job_id)
    assert before, "the training step runs"
    # What slurmctld does to a --requeue job that a lost node ended (NODE_FAIL).
    assert cluster.run(["scontrol", "requeue", job_id], timeout=30).returncode == 0

    # The requeued run's trainer has started (its "run" record): its training step is running.
    cluster.wait_for_file(run_dir, 600, predicate=lambda d: [r["type"] for r in metrics_records(d)].count("run") == 2)
    after = running_step_ids(cluster, job_id)
    # The ids seen running are some of those the first run used, not all: its sampler's step ends at
    # once where there is no GPU tool, and the sampler's srun (sent to the background) and the training
    # step's race to slurmctld for the next id, so either may be 0. The run says which it skipped.
    skipped = re.search(r"restart 1: skipped step ids 0-(\d+),", (tmp_path / f"{job_id}.out").read_text())
    assert skipped, (tmp_path / f"{job_id}.out").read_text()
    last_used = int(skipped.group(1))
    assert after and last_used >= max(before) and min(after) > last_used, (before, last_used, after)
    for step in range(last_used + 1):
        cluster.run(["scancel", "--signal=KILL", f"{job_id}.{step}"], timeout=30)

    job = cluster.wait(job_id, timeout=600)
    assert job.state == "COMPLETED", job.output()
    types = [r["type"] for r in metrics_records(run_dir)]
    assert types.count("run") == 2 and "summary" in types[types.index("run", 1):], types


@LONG
def test_a_second_job_in_the_same_run_dir_refuses_in_one_line_and_the_first_finishes(cluster, job_env, tmp_path):
    # Six epochs from the first's start of training (the lock is taken before it): the runway of the second
    # job's start, which refuses in its batch script before any step. One node each: the lock is the run dir's.
    env = {**job_env, **midrun(6, "--checkpoint-every 1")}
    first, run_dir = started_job(cluster, env, tmp_path, until=training_started, nodes=1)
    # The lock goes at the end, and a checkpoint being written (a .tmp, renamed: checkpoint.save_atomic)
    # is not one yet.
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")
                    if "logs" not in p.parts and not p.name.startswith(".ddp-run") and not p.name.endswith(".tmp"))

    second = cluster.sbatch([*sbatch_args(tmp_path, "--nodes=1", "--cpus-per-task=1"), "slurm/olivia-multinode.sh"], env=env)
    refused = cluster.wait(second, timeout=600)

    assert refused.state == "FAILED" and refused.exit_code == "2:0", refused.output()
    errors = [line for line in refused.output().splitlines() if "error" in line]
    assert len(errors) == 1, refused.output()
    assert re.match(rf"ddp: error: --run-dir {run_dir} is in use by job {first} on node1 \(pid \d+, alive \d+ s ago\)",
                    errors[0]), errors
    assert not (run_dir / "logs" / second).exists()
    job = cluster.wait(first, timeout=600)
    assert job.state == "COMPLETED", job.output()
    assert [r["type"] for r in metrics_records(run_dir)].count("run") == 1  # one start: nobody else wrote
    assert not (run_dir / ".ddp-run.lock").exists()
    assert set(before) <= {p.relative_to(run_dir) for p in run_dir.rglob("*")}


@LONG
def test_three_two_node_jobs_at_once_finish_on_ports_of_their_own_and_the_first_passes_a_healthy_gate(
        cluster, job_env, tmp_path):
    # One epoch each: the jobs' ports and their ends are the point. The first job runs the preflight and the
    # fabric gate (the other tests of the gate: test_fabric_gate.py), which on these healthy nodes pass with
    # their figures, beside the other two jobs' training. Two ranks a node: the gate's node round.
    jobs = {}
    for k in range(3):
        env = {**job_env, **TWO_A_NODE, "DDP_RUN_DIR": str(tmp_path / f"run{k}"), "DDP_MONITOR_INTERVAL": "0",
               "DDP_TRAIN_ARGS": TRAIN_ARGS.replace("--epochs 2", "--epochs 1"), **(WITH_CHECKS if k == 0 else {})}
        jobs[cluster.sbatch([*sbatch_args(tmp_path, "--cpus-per-task=8"), "slurm/olivia-multinode.sh"], env=env)] = Path(env["DDP_RUN_DIR"])
    ended, outputs = [], []
    for job_id, run_dir in jobs.items():
        ended.append(cluster.wait(job_id, timeout=600))
        outputs.append(ended[-1].output())
        assert ended[-1].state == "COMPLETED", outputs[-1]
        assert [r for r in metrics_records(run_dir) if r["type"] == "summary"][-1]["world_size"] == 4
    ports = {rendezvous_port(int(job_id), 0) for job_id in jobs}
    assert len(ports) == 3

    output, run_dir = outputs[0], next(iter(jobs.values()))
    assert "fabric gate: PASS in " in output and "on 2 node(s), 4 ranks: busbw " in output
    assert "#wrong 0" in output and "algbw" in output
    assert "preflight: ddp-launch doctor passed on every node" in output
    report = json.loads((run_dir / "gate.json").read_text())
    assert report["ok"] and report["bad_nodes"] == []
    assert report["world"]["nodes"] == cluster.job_nodes(ended[0]) and report["world"]["ranks"] == 4
    sizes = report["world"]["sizes"]
    assert [s["size_bytes"] for s in sizes] == [65536, 1048576, 4194304]
    assert all(s["wrong"] == 0 and s["busbw_gbps"] > 0 for s in sizes)
    # nccl-tests' definition: busbw = algbw * 2(n-1)/n, n = 4 ranks
    assert all(abs(s["busbw_gbps"] - s["algbw_gbps"] * 1.5) < 1e-9 for s in sizes)
    assert all("fabric gate skipped (DDP_FABRIC_GATE=0)" in text for text in outputs[1:])


def test_a_rendezvous_port_taken_on_the_head_node_is_named_in_one_line(cluster, job_env, tmp_path):
    env = {**job_env, "DDP_MONITOR_INTERVAL": "0"}
    job_id = cluster.sbatch(["--hold", *sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=env)
    # The training step's port: with no preflight and no gate (job_env), training is the job's first
    # step (0); no GPU sampler step with DDP_MONITOR_INTERVAL=0.
    port = rendezvous_port(int(job_id), 0)
    # Something else on node1 (the head) listens on it already.
    squatter = subprocess.Popen(
        ["ip", "netns", "exec", cluster.netns("node1"), "python3", "-c",
         "import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('0.0.0.0', {port}))\ns.listen(1)\nprint('listening', flush=True)\ntime.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "listening"
        cluster.run(["scontrol", "release", job_id], timeout=30)
        started = time.monotonic()
        job = cluster.wait(job_id, timeout=600)
    finally:
        squatter.kill()
        squatter.wait()
    output = job.output()
    assert job.state == "FAILED", output
    assert time.monotonic() - started < 240
    lines = [line for line in output.splitlines() if str(port) in line and "error" in line]
    assert lines, output
    assert "Traceback" not in output
    assert re.search(rf"ddp-launch: error: rendezvous port {port} on the head node \(\S+:{port}\) is already in use", lines[0]), lines
    # The other node names the head's line at once (its run dir report), rather than wait for a store that
    # never comes until srun's --wait kills it (137) or say "raise --rdzv-timeout".
    assert re.search(rf"^(\S+: )?ddp-launch: error: node1's ddp-launch stopped first \(exit 1\): ddp-launch: error: "
                     rf"rendezvous port {port} on the head node .*; this node stops too$", output, re.M), output
    assert "raise --rdzv-timeout" not in output
    assert job.exit_code == "1:0", job.exit_code


@LONG
def test_a_run_dir_whose_disk_fills_mid_run_stops_in_one_line_and_resumes_once_space_is_freed(
        cluster, job_env, tmp_path):
    # A 64 MiB ext4 on a loop device, mounted over the run dir in both nodes' mount namespaces
    # (one block device mounted twice is one file system, as a shared one is): a disk of its
    # own that fills up. This machine's own view of the path is not it: files are read via node1.
    long_job_env = {**job_env, "DDP_TRAIN_ARGS": DISK_RUN}
    run_dir = Path(long_job_env["DDP_RUN_DIR"])
    run_dir.mkdir()
    disk = tmp_path / "disk.img"
    subprocess.run(["truncate", "-s", "64M", str(disk)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(disk)], check=True)  # -m 0: root gets no reserve
    loop = subprocess.run(["losetup", "--find", "--show", str(disk)], check=True, capture_output=True,
                          text=True).stdout.strip()

    def on_node1(*argv: str) -> subprocess.CompletedProcess:
        return cluster.node_exec("node1", list(argv), timeout=120)

    def node1_records(kind: str) -> list[dict]:
        text = on_node1("cat", str(run_dir / "metrics.jsonl")).stdout
        return [json.loads(line) for line in text.splitlines() if f'"type": "{kind}"' in line]

    def between_saves() -> bool:
        names = on_node1("ls", "-A", str(run_dir)).stdout.split()
        return "checkpoint.prev.pt" in names and not any(name.endswith(".tmp") for name in names)

    try:
        for node in cluster.node_names:
            assert cluster.node_exec(node, ["mount", loop, str(run_dir)]).returncode == 0
        # The new file system's root is root's: the jobs' user must write there.
        owner = f"{apptainer_root.TEST_UID}:{apptainer_root.TEST_UID}"
        assert on_node1("chown", owner, str(run_dir)).returncode == 0
        job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=long_job_env)
        # Filled between two saves: a save in flight while `df` reads the free space would take
        # the room left for the logs, and fail a print before the checkpoint (or replace the
        # checkpoint this test keeps). After epoch 2's save there is a checkpoint.prev.pt and no
        # temporary file (checkpoint.save_atomic); epoch 3's comes an epoch later.
        cluster.wait_for_file(run_dir, 600, predicate=lambda _: len(node1_records("epoch")) >= 2
                              and between_saves())
        # Everything but 2 MiB taken: the logs' lines fit, the next checkpoint (8 MiB) does not.
        free_kib = int(on_node1("df", "--output=avail", "-k", str(run_dir)).stdout.split()[-1])
        on_node1("fallocate", "-l", f"{max(free_kib - 2048, 0)}k", str(run_dir / "filler"))
        kept = on_node1("sha256sum", str(run_dir / "checkpoint.pt")).stdout.split()[0]

        job = cluster.wait(job_id, timeout=600)

        output = job.output()
        assert job.state == "FAILED" and job.exit_code == "2:0", output
        # The rank's own line once; node2's launcher (or its ranks) may quote it, naming node1's launcher as
        # the one that stopped first (ddp_contract.launcher_reports), never as a lost node.
        quoted = [line for line in output.splitlines() if "ddp-train: error:" in line and "stopped first" in line]
        errors = [line for line in output.splitlines() if "ddp-train: error:" in line and line not in quoted]
        assert len(errors) == 1, output
        assert all("node1's ddp-launch stopped first (exit 2): ddp-train: error: cannot write the" in line
                   for line in quoted), quoted
        assert "lost contact" not in output
        assert "cannot write the" in errors[0] and "No space left on device" in errors[0], errors
        assert f"free in {run_dir}" in errors[0]
        assert "Traceback" not in output
        assert on_node1("sha256sum", str(run_dir / "checkpoint.pt")).stdout.split()[0] == kept

        on_node1("rm", "-f", str(run_dir / "filler"))
        again = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=long_job_env)
        assert cluster.wait(again, timeout=600).state == "COMPLETED"
        starts = node1_records("run")
        assert len(starts) == 2 and starts[-1]["resumed_from_epoch"] >= 2
    finally:
        cluster.cancel_all()
        for node in cluster.node_names:
            cluster.node_exec(node, ["umount", "-l", str(run_dir)])
        subprocess.run(["losetup", "-d", loop])
