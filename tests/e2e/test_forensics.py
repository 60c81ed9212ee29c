"""When a rank hangs or straggles, the job says which, where and why; every run says what ran."""
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TRAIN_ARGS, Cluster, sbatch_args, epochs_done, metrics_records

pytestmark = pytest.mark.e2e

# The collective timeout the hang test runs under: the watchdog acts at half of it.
DIST_TIMEOUT_S = 40
# After the timeout: the job script's own ending (srun ends the step, SLURM records the job).
SLACK_S = 45
LONG_RUN = ("--epochs 30 --batch-size 64 --width-scale 0.25 --allow-unverified-data "
            f"--dist-timeout-s {DIST_TIMEOUT_S}")



def _workers(cluster: Cluster, node: str) -> dict[int, int]:
    """{global rank: pid} of the trainer workers in one node's namespace, read from /proc."""
    pids = subprocess.run(["ip", "netns", "pids", cluster.netns(node)], capture_output=True,
                          text=True).stdout.split()
    found = {}
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"ddp_launch.worker" not in cmdline or b"ddp_launch.agent" in cmdline:
            continue
        rank = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"RANK=")]
        if rank:
            found[int(rank[0])] = int(pid)
    return found


def test_a_rank_stopped_mid_epoch_is_named_with_its_node_step_and_place_and_the_job_crashes(
        cluster, job_env, tmp_path):
    job_env = {**job_env, "DDP_TRAIN_ARGS": LONG_RUN}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)
    cluster.wait_for_file(run_dir, 600, predicate=lambda d: epochs_done(d) >= 1)

    workers = _workers(cluster, "node2")
    assert len(workers) == 2, workers
    rank = max(workers)
    # SIGSTOP: the process neither crashes nor answers; its peers wait in the next collective.
    subprocess.run(["kill", "-STOP", str(workers[rank])], check=True)
    stopped_at = time.monotonic()
    job = cluster.wait(job_id, timeout=DIST_TIMEOUT_S + SLACK_S + 30)
    took = time.monotonic() - stopped_at
    print(f"the job ended {took:.1f} s after rank {rank} was stopped")

    output = job.output()
    assert took < DIST_TIMEOUT_S + SLACK_S, output
    assert job.state == "FAILED", output
    assert job.exit_code.startswith("1:"), job.exit_code  # a crash: never requeued blindly
    named = re.findall(rf"ddp-launch: error: rank {rank} on node2 stopped advancing at step \d+ "
                       rf"\(.*stopped by a signal \(T\)\) at \S+:\d+ in \S+", output)
    assert len(named) == 1, output
    forensics = run_dir / "forensics"
    for r in (rank - 1, rank):  # both of node2's workers; node1's agent writes its own
        assert "most recent call first" in (forensics / f"stacks-rank{r}.txt").read_text()
    # gloo records collectives into the Flight Recorder; the trainer dumps it when asked.
    assert (forensics / f"fr-trace-rank{rank - 1}").stat().st_size > 0


def test_a_slow_rank_is_named_as_a_straggler_in_the_summary_and_the_report(cluster, job_env, tmp_path):
    # DDP_TEST_SLOW_RANK (a test-only switch, ddp_train/safety/steptime.py): rank 3 sleeps 1 s in every
    # step's compute, several times the threshold over the others on this 2-core machine.
    job_env = {**job_env, "DDP_TEST_SLOW_RANK": "3:1.0"}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)
    job = cluster.wait(job_id, timeout=600)

    output = job.output()
    assert job.state == "COMPLETED", output
    assert re.search(r"Straggler: rank 3 on node2 computes [\d.]+ ms per step, \d+% over the others'", output), output
    summary = [r for r in metrics_records(run_dir) if r["type"] == "summary"][-1]
    assert sorted(r["rank"] for r in summary["step_times"]) == [0, 1, 2, 3]
    # Rank 3 is named, and named as the worst. Under the whole suite's load another rank's median of 16
    # steps has come out 21 % over the others (noise over the 20 % threshold): that rank is named too,
    # each once, and node2 is not called a slow node for it.
    named = sorted(summary["stragglers"], key=lambda s: s["over"], reverse=True)
    assert named and named[0]["who"] == "rank 3 on node2", named
    assert all(s["who"].startswith("rank ") for s in named), named
    assert len(re.findall(r"Straggler: ", output)) == len(named), output

    report = subprocess.run(["ddp-bench", "report", str(run_dir), "--out", str(tmp_path / "report")],
                            env=cluster.env, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "straggler rank 3 on node2" in report.stdout, report.stdout
    assert (tmp_path / "report" / "step-times.png").stat().st_size > 0


def test_the_manifest_lists_the_libraries_a_worker_mapped_and_who_set_each_variable(cluster, job_env, tmp_path):
    # A host library bound into the container (Apptainer: APPTAINER_BINDPATH, "Bind Paths and
    # Mounts") and preloaded in the container only (APPTAINERENV_*, "Environment and Metadata").
    host_lib = Path("/lib/x86_64-linux-gnu/libz.so.1").resolve()
    libs = tmp_path / "hostlib"
    libs.mkdir()
    (libs / host_lib.name).write_bytes(host_lib.read_bytes())
    job_env = {**job_env, "APPTAINER_BINDPATH": f"{libs}:/opt/hostlib",
               "APPTAINERENV_LD_PRELOAD": f"/opt/hostlib/{host_lib.name}",
               # The fabric default is 1 (containers/sites/fabrics/common.json): the user's 3 must win
               # and be said to be the user's.
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
               "DDP_TRAIN_ARGS": TRAIN_ARGS.replace("--epochs 2", "--epochs 1")}
    run_dir = Path(job_env["DDP_RUN_DIR"])
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)
    job = cluster.wait(job_id, timeout=600)
    output = job.output()
    assert job.state == "COMPLETED", output

    manifest = json.loads((run_dir / "manifest.json").read_text())
    mapped = {lib["path"]: lib for lib in manifest["all_libraries_rank0"]}
    bound = mapped[f"/opt/hostlib/{host_lib.name}"]
    assert bound["bound"] and bound["mount"] == "/opt/hostlib", bound
    assert bound["version"] == host_lib.name.split(".so.")[1]
    assert [lib["bound"] for lib in manifest["libraries"]["torch"]] == [False] * len(manifest["libraries"]["torch"])
    assert manifest["environment"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["value"] == "3"
    assert manifest["environment"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["set_by"].startswith("user")
    assert manifest["environment"]["TORCH_FR_BUFFER_SIZE"]["set_by"].startswith("launcher")
    assert manifest["nodes"] == {"node1": [0, 1], "node2": [2, 3]}
    # The three lines in the job output (after torchrun's "node1:rank0: " prefix).
    assert re.search(r"^(\S+: )?Image: \S+", output, re.M), output
    assert re.search(r"^(\S+: )?Libraries \(mapped, torch [^)]+\): .*more from host binds: /opt/hostlib/",
                     output, re.M), output
    assert re.search(r"^(\S+: )?Environment: .*by user: .*TORCH_NCCL_ASYNC_ERROR_HANDLING=3", output, re.M), output
