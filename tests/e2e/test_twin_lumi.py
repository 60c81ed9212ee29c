"""slurm/lumi-multinode.sh on LUMI's twin, unchanged and with its own site (lumi) and runtime.

The twin (tests/e2e/cluster/twins/lumi.sh, tests/e2e/twins.py): LUMI-G nodes nid005NNN with four
Slingshot NICs hsn0-hsn3 and /dev/cxi0-3, /dev/kfd and a render node per GCD, eight GCDs a node in
gres; /opt/cray with HPE's libfabric, libcxi and libjansson in /usr/lib64 and LUMI's file systems,
the paths LUMI's singularity bindings name; SingularityCE's `singularity` and no `apptainer`. The
image is gpu.def built with SITE=lumi on a base laid out as LUMI AI Factory's (libfabric, libcxi
and RCCL's plugin found through ld.so.conf, no LD_LIBRARY_PATH). The script is submitted by the
README's LUMI-G quick start's sbatch line, with only --output and short-training flags added; each
of its 8 tasks a node trains on CPU in place of its GCD.
"""
from __future__ import annotations

import json
import re

import pytest
import twins
from conftest import (doctor_reports, metrics_records, own_script_job, quick_start_job, rank_logs, submit_quick_start,
                      submit_twin_jobs, twin_job_env, user_dir)

pytestmark = pytest.mark.e2e

TWIN = twins.LUMI


@pytest.fixture(scope="module")
def lumi_jobs(twin, lumi_sif, cifar_data, tmp_path_factory):
    """lumi-multinode.sh as the README's quick start submits it on LUMI (standard-g, 2 nodes, 8 GPUs and
    8 tasks each), run to its end, by a user who binds a directory of their own through SINGULARITY_BIND,
    as LUMI's documentation shows; and, submitted with it, the README's own-script quick start for LUMI (one
    node of 8 tasks running examples/env_ranks.py). {"quick start" | "own": (Job, run dir, output)}."""
    runs = {name: user_dir(tmp_path_factory.mktemp(f"lumi-{name}")) / "run" for name in ("multinode", "own")}
    env = {**twin_job_env(TWIN, lumi_sif, cifar_data, runs["multinode"]), "SINGULARITY_BIND": f"{cifar_data}:/user-data"}
    jobs = {"quick start": quick_start_job(TWIN, env),
            "own": own_script_job(TWIN, twin_job_env(TWIN, lumi_sif, cifar_data, runs["own"]), runs["own"])}
    ended = submit_twin_jobs(twin, jobs, timeout=900)
    return {name: (ended[name], jobs[name].run_dir, ended[name].output()) for name in jobs}


@pytest.fixture(scope="module")
def multinode(lumi_jobs):
    return lumi_jobs["quick start"]


def test_lumi_multinode_trains_one_rank_per_gcd_on_two_nodes(twin, multinode):
    job, run_dir, output = multinode
    assert job.state == "COMPLETED", output
    assert "site lumi" in output and "Number of nodes: 2" in output and "World size: 16" in output
    assert "Training completed successfully." in output
    assert twin.job_nodes(job) == ["nid005000", "nid005001"]
    assert rank_logs(run_dir) == [f"{job.job_id}-nid00500{rank // 8}-rank{rank}.out" for rank in range(16)]
    summary = [r for r in metrics_records(run_dir) if r["type"] == "summary"][-1]
    assert summary["world_size"] == 16 and summary["nodes"] == 2


def test_lumi_binds_reach_singularity_through_singularity_bind(multinode, cifar_data):
    _, _, output = multinode
    assert "APPTAINER_BIND=" not in output
    bound = re.search(r"^ddp: SINGULARITY_BIND=(\S+)$", output, re.M).group(1).split(",")
    # The user's own SINGULARITY_BIND first: SingularityCE reads that variable alone (its user guide,
    # "Bind Paths and Mounts"), so the job's value keeps it rather than replacing it.
    assert bound[0] == f"{cifar_data}:/user-data"
    assert bound[1:11] == ["/var/spool/slurmd:/var/spool/slurmd", "/opt/cray:/opt/cray",
                          "/usr/lib64/libcxi.so.1:/usr/lib64/libcxi.so.1",
                          "/usr/lib64/libjansson.so.4:/usr/lib64/libjansson.so.4", "/pfs:/pfs", "/scratch:/scratch",
                          "/projappl:/projappl", "/project:/project", "/flash:/flash", "/appl:/appl"]


def test_lumi_preflight_finds_the_images_fabric_libraries_through_ld_so_conf(multinode):
    job, run_dir, _ = multinode
    reports = doctor_reports(run_dir, job)
    assert sorted(reports) == ["nid005000", "nid005001"]
    for node, checks in reports.items():
        assert checks["fabric devices"]["detail"].endswith("devices: cxi0, cxi1, cxi2, cxi3"), node
        # The image's own, first where ld.so looks (ld.so.conf's multiarch directory), not the host's
        # libcxi that LUMI's bindings put in /usr/lib64.
        # (/lib is /usr/lib and /lib64 /usr/lib64 in the image: one file under two names is one library.)
        assert checks["libcxi"]["detail"] == ("/lib/x86_64-linux-gnu/libcxi.so.1 loads; also /lib64/libcxi.so.1 "
                                              "(later in ld.so's search, not used)"), checks["libcxi"]
        assert checks["libfabric"]["detail"] == "/lib/x86_64-linux-gnu/libfabric.so.1 loads (libfabric 2.1)"
        assert checks["RCCL"]["detail"] == "/opt/rocm/lib/librccl.so.1 loads (NCCL 2.22.3)", checks["RCCL"]
        assert checks["OFI plugin"]["detail"] == "/opt/rocm/lib/librccl-net.so loads", checks["OFI plugin"]
        # gloo's CPU workers take the interface that routes to the head node, a Slingshot NIC.
        assert checks["interface"]["detail"] == "NCCL_SOCKET_IFNAME=hsn0"
        assert checks["gpus"]["status"] == "WARN" and "8 granted" in checks["gpus"]["detail"], checks["gpus"]


def test_lumi_sets_no_gdr_level_and_its_gate_builds_no_subgroup(multinode):
    """The LAIF ROCm 7.0 image deadlocks multi-node init with NCCL_NET_GDR_LEVEL set
    (laifs-container-recipes#28, #30) and can hang in a second process group (#44): the job's workers
    get no GDR level, and the gate measures the world alone, saying why in gate.json."""
    job, run_dir, output = multinode
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "NCCL_NET_GDR_LEVEL" not in manifest["environment"], manifest["environment"]
    gate = json.loads((run_dir / "gate.json").read_text())
    assert gate["ok"] and gate["rounds"] == []
    assert any(note.startswith("no node or pair rounds: site lumi builds no process group but the world's")
               for note in gate["notes"]), gate["notes"]
    # The image names its base, the LAIF image family: the doctor matched the known issues against it.
    for node, checks in doctor_reports(run_dir, job).items():
        assert checks["known issues"]["status"] == "OK", checks["known issues"]
        assert re.search(r"base_image /\S*/lumi-multitorch-torch-u24r70f21m50t210-e2e\w+\.sif",
                         checks["known issues"]["detail"]), (node, checks["known issues"])


def test_lumi_job_with_the_2024_courses_gdr_level_stops_before_training_in_one_line(twin_cluster, lumi_sif,
                                                                                    cifar_data, tmp_path):
    """A user who exports NCCL_NET_GDR_LEVEL=3 as LUMI's 2024 training material did: on the ROCm 7.0 LAIF
    image every node's doctor FAILs the known issue, so the job stops before the gate and the training,
    exit 2, naming the fix, and excludes no node."""
    run_dir = user_dir(tmp_path / "gdr") / "run"
    env = {**twin_job_env(TWIN, lumi_sif, cifar_data, run_dir), "NCCL_NET_GDR_LEVEL": "3"}

    job = submit_quick_start(twin_cluster, TWIN, env, timeout=300)

    output = job.output()
    assert (job.state, job.exit_code) == ("FAILED", "2:0"), output
    [line] = [line for line in output.splitlines() if "known issue laifs-28-gdr-level" in line]
    assert line.startswith("ddp: error: preflight: ddp-launch doctor fails 'known issue laifs-28-gdr-level' on every "
                           "node of the job (2 of 2): base_image "), line
    assert ", NCCL_NET_GDR_LEVEL 3: multi-node torch.distributed init deadlocks" in line
    assert line.endswith("fix: unset NCCL_NET_GDR_LEVEL (in the job script, your environment or ~/.nccl.conf): RCCL "
                         "detects the level from the PCI topology, and LUMI-AI-Guide PR #97 removed it from every "
                         "multi-node example"), line
    assert not (run_dir / "gate.json").exists() and not (run_dir / "quarantine.json").exists()
    assert "Training completed" not in output


def test_lumi_node_has_singularity_and_no_apptainer(twin):
    done = twin.node_exec("nid005001", ["sh", "-c", "command -v singularity; command -v apptainer"])
    assert done.stdout.split() == ["/usr/bin/singularity"] and done.returncode != 0, done


def test_lumi_twin_nodes_carry_four_nics_cxi_devices_gcds_and_standard_g(twin):
    done = twin.run(["srun", "--partition=standard-g", "--nodelist=nid005001", "--gpus-per-node=8", "sh", "-c",
                     "hostname; ls /sys/class/net; ls /dev/cxi* /dev/kfd /dev/dri; echo $ROCR_VISIBLE_DEVICES"],
                    timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["nid005001", "hsn0", "hsn1", "hsn2", "hsn3", "lo", "/dev/cxi0", "/dev/cxi1",
                                   "/dev/cxi2", "/dev/cxi3", "/dev/kfd", "/dev/dri:",
                                   *[f"renderD{128 + i}" for i in range(8)], "0,1,2,3,4,5,6,7"]
    partitions = twin.run(["sinfo", "-h", "-o", "%P"], timeout=30).stdout.split()
    assert partitions == ["standard-g", "small-g", "dev-g"]


def test_lumi_image_help_is_lumis_singularity_its_binds_variable_and_srun_options(twin, lumi_sif):
    """`make build-lumi` fills gpu.def's %help from LUMI's profile (containers/image_help.py): on a LUMI node,
    the image the real build made shows the commands that work there. `run-help` prints the image's
    /.singularity.d/runscript.help (Apptainer's cmd/internal/cli/help: /bin/cat of that file in the
    container); here it is read with `singularity exec`, since the twin's singularity is Apptainer's, whose
    run-help execs /usr/bin/apptainer, which a LUMI node (and so the twin) does not have."""
    done = twin.as_user(["srun", "--partition=standard-g", "--nodes=1", "--ntasks=1", "singularity", "exec",
                         str(lumi_sif), "cat", "/.singularity.d/runscript.help"], timeout=120)
    assert done.returncode == 0, done.stderr
    assert 'export SINGULARITY_BIND="$(PYTHONPATH="$REPO/entrypoints" python3 -m ddp_launch.binds --site lumi)"' \
        in done.stdout, done.stdout
    assert "srun --network=disable_rdzv_get singularity run --rocm train.sif --nodes 2 -- --epochs 100" in done.stdout
    assert "apptainer" not in done.stdout and "APPTAINER_BIND" not in done.stdout and "{{" not in done.stdout


def test_lumi_own_script_runs_one_rank_per_gcd_in_singularity_with_its_own_ranks(twin, lumi_jobs):
    """The README's own-script line for LUMI, word for word (one node: DDP_TRAIN_NODES=1 with sbatch
    --nodes=1): examples/env_ranks.py reads RANK and LOCAL_RANK, one task per GCD, in SingularityCE."""
    job, run_dir, output = lumi_jobs["own"]
    assert job.state == "COMPLETED", output
    assert "ranks [0, 1, 2, 3, 4, 5, 6, 7] of 8, local ranks [0, 1, 2, 3, 4, 5, 6, 7], 1 host(s)" in output
    assert "done: 40 steps" in output  # the example's default: the line gives no --steps
    (node,) = twin.job_nodes(job)
    assert rank_logs(run_dir) == [f"{job.job_id}-{node}-rank{rank}.out" for rank in range(8)]
    (checks,) = doctor_reports(run_dir, job).values()
    assert checks["workload"]["status"] == "OK" and checks["dataset"]["status"] == "SKIP", checks["workload"]
