"""When a rank straggles, the job says which and by how much; every run says what ran. A rank that hangs:
tests/e2e/test_twin_olivia.py, on the twin of the cluster whose script it runs."""
import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import LONG, TRAIN_ARGS, TWO_A_NODE, sbatch_args, metrics_records

pytestmark = pytest.mark.e2e


@LONG
def test_a_slow_rank_is_named_as_a_straggler_in_the_summary_and_the_report(cluster, job_env, tmp_path):
    # DDP_TEST_SLOW_RANK (a test-only switch, ddp_train/safety/steptime.py): rank 3 sleeps 1 s in every
    # step's compute, several times the threshold over the others on this 2-core machine. Two ranks a node: a
    # slow rank beside a rank of its node that is not slow is a straggler, not a slow node.
    job_env = {**job_env, **TWO_A_NODE, "DDP_TEST_SLOW_RANK": "3:1.0"}
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
    assert manifest["nodes"] == {"node1": [0], "node2": [1]}
    # The three lines in the job output (after torchrun's "node1:rank0: " prefix).
    assert re.search(r"^(\S+: )?Image: \S+", output, re.M), output
    assert re.search(r"^(\S+: )?Libraries \(mapped, torch [^)]+\): .*more from host binds: /opt/hostlib/",
                     output, re.M), output
    assert re.search(r"^(\S+: )?Environment: .*by user: .*TORCH_NCCL_ASYNC_ERROR_HANDLING=3", output, re.M), output
