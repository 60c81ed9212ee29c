"""slurm/olivia-*.sh on Olivia's twin, unchanged and with their own site (olivia).

The twin (tests/e2e/cluster/twins/olivia.sh, tests/e2e/twins.py): nodes nid00NNNN on Slingshot's
hsn0 with /dev/cxi0; the host libfabric, libcxi, NCCL and its OFI plugin as real ELF files where
Olivia has them, with the closure they link; the NCCL module's EBROOT* and LD_LIBRARY_PATH; the
accel partition and four GPUs a node in gres. The image is the x86_64 one (gpu.def): the scripts
name their site, and Olivia's arm64 build runs in test_make_build.py. The scripts get only --output
and short-training flags; CPU workers stand in for the GPUs. One 2-node run of olivia-multinode.sh,
submitted by the README's Olivia quick start's sbatch line word for word, serves the tests that read it;
a second one is the hang that the watchdog names, with NCCL's RAS answered by a stand-in on each node.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import twins
from conftest import (OWN_SCRIPT, REPO, WITHOUT_CHECKS, Cluster, container_versions, doctor_reports, epochs_done,
                      fake_nvidia_smi_env, metrics_records, output_of, run_twin_scripts, submit_twin_job,
                      twin_job_env, user_dir)

pytestmark = pytest.mark.e2e

TWIN = twins.OLIVIA


ONE_NODE_SCRIPTS = ("slurm/olivia-1gpu.sh", "slurm/olivia-1node-4gpu.sh")


# A node shared with other jobs, as Olivia's 1-GPU script says its nodes are: GPU 3, another job's, has
# an uncorrectable ECC error and slows down hot (the fake nvidia-smi's case); the 1-GPU job holds GPU 0.
SHARED_NODE_CASE = "other-job-gpu-sick"


# A known problem of the site's own (containers/sites/known-issues/README.md), named by the user's
# DDP_KNOWN_ISSUES: a slowdown of the libfabric Olivia binds (2.3 since its April 2026 upgrade). A made-up
# row: the test stands in for a site that publishes one.
SITE_ROWS = {"schema": 1, "name": "olivia-status", "rows": [{
    "id": "olivia-libfabric-23-slow", "summary": "all-reduce above 1 GiB at half speed on the accel nodes",
    "effect": "slow", "versions": {"libfabric": "==2.3", "gpu": "gh200"},
    "fix": "module load libfabric/2.3.2 once it is installed", "source": "https://example.org/olivia-status"}]}


# The batch shell's line once the preflight has run: its USR2 trap is in place from before the preflight, and
# the training step has not started (the fabric gate runs between the two).
PREFLIGHT_DONE = "ddp: preflight step: "


def stop_at_the_time_limit(twin, output, job_id: str, timeout: float = 600) -> None:
    """What SLURM does 120 s before the job's time limit (`--signal=B:USR2@120`): USR2 to the batch shell
    alone, by hand `scancel --batch --signal=USR2` (scancel(1)). Sent once the preflight has run, so that
    the stop is waiting when the script's first step asks (its steps take milliseconds: one sent mid-run
    could come after its last)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if output.exists() and PREFLIGHT_DONE in output.read_text(errors="replace"):
            twin.run(["scancel", "--batch", "--signal=USR2", job_id], timeout=30)
            return
        time.sleep(1)


@pytest.fixture(scope="module")
def olivia_jobs(twin, images, cifar_data, tmp_path_factory):
    """Every Olivia script submitted at once, as on Olivia: multinode (2 nodes of 4 GPUs, 72 cores and
    440G a task) takes two of the three nodes, the one-node scripts the third in turn; and after them the
    README's own-script quick start for Olivia (examples/argparse_torchrun.py in olivia-1gpu.sh), stopped at
    its time limit and requeued. The multinode job's user names a known-issues file of the site's own
    (SITE_ROWS). {script (or OWN_SCRIPT): (Job, run dir, output)}."""
    stoppers = []

    def stop_the_own_script(key, job, job_id):
        if key == OWN_SCRIPT:
            stoppers.append(threading.Thread(target=stop_at_the_time_limit, args=(twin, output_of(job, job_id), job_id),
                                             daemon=True))
            stoppers[-1].start()

    shared = fake_nvidia_smi_env(tmp_path_factory.mktemp("nvidia-smi"),
                                 {node: SHARED_NODE_CASE for node in ("nid001000", "nid001001", "nid001002")})
    rows = user_dir(tmp_path_factory.mktemp("site-rows")) / "olivia-status.json"
    rows.write_text(json.dumps(SITE_ROWS))
    jobs = run_twin_scripts(twin, TWIN, ("slurm/olivia-multinode.sh", *ONE_NODE_SCRIPTS), images.x86, cifar_data,
                            tmp_path_factory, extra_env={"slurm/olivia-1gpu.sh": shared,
                                                         "slurm/olivia-multinode.sh": {"DDP_KNOWN_ISSUES": str(rows)}},
                            own_script=True, on_submit=stop_the_own_script)
    for stopper in stoppers:
        stopper.join(timeout=60)
    return jobs


@pytest.fixture(scope="module")
def multinode(olivia_jobs):
    return olivia_jobs["slurm/olivia-multinode.sh"]


def test_olivia_multinode_trains_two_nid_nodes_to_completion(twin, multinode, images):
    job, run_dir, output = multinode
    assert job.state == "COMPLETED", output
    assert "site olivia" in output and "Number of nodes: 2" in output and "World size: 4" in output
    assert "Training completed successfully." in output
    summary = [r for r in metrics_records(run_dir) if r["type"] == "summary"][-1]
    assert summary["world_size"] == 4 and summary["nodes"] == 2
    nodes = twin.job_nodes(job)
    assert nodes == ["nid001000", "nid001001"]
    for node in nodes:  # torchrun's logs, one per worker on the node
        assert len(list((run_dir / "logs" / job.job_id).glob(f"{node}/*/attempt_0/*/stdout.log"))) == 2, node
    assert "nid001000:rank0: " in output
    run = [r for r in metrics_records(run_dir) if r["type"] == "run"][-1]
    # Built on the x86_64 image's base: the same Python and torch.
    assert {k: run["versions"][k] for k in ("python", "torch")} == container_versions(images.x86)


def test_olivia_binds_the_module_roots_the_cray_libfabric_and_the_closure_libcxi_needs(multinode):
    _, _, output = multinode
    bound = re.search(r"^ddp: APPTAINER_BIND=(\S+)$", output, re.M).group(1).split(",")
    assert bound[:4] == [f"{twins.OLIVIA_OFI}:/opt/aws-ofi-nccl", "/opt/cray/libfabric/2.3.1:/opt/libfabric",
                         f"{twins.OLIVIA_NCCL}:/opt/nccl", "/usr/lib64/libcxi.so.1:/opt/host-libs/libcxi.so.1"]
    closure = {entry.split(":")[1] for entry in bound[4:] if entry.startswith("/") and "/opt/host-libs/" in entry}
    assert closure == {f"/opt/host-libs/{name}" for name in ("libfakehwloc.so.15", "libfakejson.so.5",
                                                              "libfakeatomic.so.1", "libfakenl-3.so.200",
                                                              "libfakeudev.so.1")}


def test_olivia_preflight_loads_the_bound_host_libraries_on_every_node(multinode):
    job, run_dir, _ = multinode
    reports = doctor_reports(run_dir, job)
    assert sorted(reports) == ["nid001000", "nid001001"]
    for node, checks in reports.items():
        assert checks["fabric devices"]["status"] == "OK" and checks["fabric devices"]["detail"].endswith("devices: cxi0")
        assert checks["libfabric"]["detail"] == "/opt/libfabric/lib64/libfabric.so.1 loads (libfabric 2.3)", node
        assert checks["NCCL"]["detail"] == "/opt/nccl/lib/libnccl.so.2 loads (NCCL 2.27.7)", node
        assert checks["OFI plugin"]["detail"] == "/opt/aws-ofi-nccl/lib/libnccl-net.so loads", node
        assert checks["libcxi"]["detail"] == "/opt/host-libs/libcxi.so.1 loads", node
        assert checks["library dependencies"]["status"] == "OK", checks["library dependencies"]
        assert (checks["fi_info -p cxi"]["status"], checks["fi_info -p cxi"]["detail"]) == ("OK", "provider: cxi")
        assert checks["interface"]["detail"] == "NCCL_SOCKET_IFNAME=hsn0"
        # SLURM granted the gres GPUs; the CPU workers are the job's choice, not a sick node.
        assert checks["gpus"]["status"] == "WARN" and "4 granted" in checks["gpus"]["detail"]


def test_olivia_multinode_trains_with_a_warning_for_each_known_problem_of_its_bound_stack(multinode):
    """The doctor matches what the nodes bind (the module's aws-ofi-nccl 1.16.3, read from its package
    string; the Cray libfabric 2.3) against the shipped known issues and the user's own file: two that
    only warn (a crash inside a CUDA graph capture, fixed in aws-ofi-nccl 1.21.0; the site's slowdown),
    printed once for both nodes, and the job trains."""
    job, run_dir, output = multinode
    assert job.state == "COMPLETED", output
    nodes = "nodes nid001000, nid001001"
    assert (f"preflight: warning: known issue aws-ofi-nccl-graph-capture on {nodes}: aws-ofi-nccl "
            f"{twins.OLIVIA_OFI_VERSION}, accelerator nvidia: the OFI plugin's GPU memory allocations") in output
    assert (f"preflight: warning: known issue olivia-libfabric-23-slow on {nodes}: libfabric 2.3, gpu gh200: "
            "all-reduce above 1 GiB at half speed on the accel nodes (slow; https://example.org/olivia-status); "
            "fix: module load libfabric/2.3.2 once it is installed") in output
    for checks in doctor_reports(run_dir, job).values():
        assert checks["known issue olivia-libfabric-23-slow"]["status"] == "WARN"
        assert checks["nccl config files"]["status"] == "OK", checks["nccl config files"]
    # The trainer read the same rows (the shipped ones and the user's) for the manifest; its CPU workers
    # map no NCCL, plugin or libfabric, so nothing of theirs matches.
    manifest = json.loads((run_dir / "manifest.json").read_text())
    shipped = len(json.loads((twins.REPO / "containers/sites/known-issues/upstream.json").read_text())["rows"])
    assert manifest["known_issues"] == {"rows": shipped + 1, "matches": []}


def test_olivia_gate_reports_the_bandwidth_without_judging_it_by_the_nccl_floor(multinode):
    _, run_dir, output = multinode
    assert ("the site's published 122.6 GB/s was measured with nccl on cuda and this gate ran gloo on cpu"
            in output)
    assert re.search(r"fabric gate: PASS in [\d.]+ s on 2 node\(s\), 4 ranks", output), output
    assert (run_dir / "gate.json").is_file()


def test_olivia_workers_talk_over_hsn0_with_the_sites_cxi_settings(multinode):
    _, _, output = multinode
    environment = re.search(r"^nid001000:rank0: Environment: (.*)$", output, re.M).group(1)
    assert "by site profile: FI_CXI_DEFAULT_TX_SIZE=2048 FI_CXI_RX_MATCH_MODE=hybrid" in environment
    assert "GLOO_SOCKET_IFNAME=hsn0 NCCL_SOCKET_IFNAME=hsn0" in environment


def test_olivia_gpu_sampler_runs_once_on_each_node_and_stops(multinode, twin):
    job, run_dir, output = multinode
    for node in twin.job_nodes(job):
        said = (run_dir / "gpu" / f"sampler-{node}.log").read_text()
        assert said.count(f"nvidia-smi not found on {node}") == 1, said
    assert "GPU sampler stopped" in output


@pytest.mark.parametrize("script", ONE_NODE_SCRIPTS)
def test_olivia_one_node_scripts_train_to_completion(twin, olivia_jobs, script):
    job, run_dir, output = olivia_jobs[script]
    assert job.state == "COMPLETED", output
    assert "site olivia" in output and "Number of nodes: 1" in output and "Training completed successfully." in output
    assert "World size: 2" in output  # the CPU workers in place of the node's GPUs
    assert len(twin.job_nodes(job)) == 1


def test_olivia_1gpu_job_on_a_shared_node_trains_though_another_jobs_gpu_is_sick_and_hot(twin, olivia_jobs):
    # The preflight judges the GPU SLURM granted (SLURM_STEP_GPUS / SLURM_JOB_GPUS, the node's own GPU
    # IDs), not GPU 3, which nvidia-smi lists but another job holds: no exclusion, no requeue.
    job, run_dir, output = olivia_jobs["slurm/olivia-1gpu.sh"]
    assert job.state == "COMPLETED", output
    (node,) = twin.job_nodes(job)
    health = doctor_reports(run_dir, job)[node]["gpu health"]
    assert health["status"] == "OK", health
    assert re.search(r"^4 GPU\(s\) listed by nvidia-smi, 1 granted; judged GPU [012], the one\(s\) "
                     r"SLURM_(STEP|JOB)_GPUS=[012] grants \(the others are other jobs'\)", health["detail"]), health
    assert "named by the doctor" not in output and "bad node(s)" not in output


def test_olivia_ddp_bench_report_runs_in_the_image_on_a_compute_node_as_documented(twin, olivia_jobs, images, tmp_path):
    """README.md, "Figures": Olivia's login node has Python 3.6 and cannot run the arm64 image, so the
    report runs in the image on an accel node, with srun. Here on the twin's nodes, with its x86_64 image,
    over the three scripts' runs."""
    out = user_dir(tmp_path) / "bench-report"
    runs = [str(olivia_jobs[script][1]) for script in (*ONE_NODE_SCRIPTS, "slurm/olivia-multinode.sh")]
    done = twin.as_user(["srun", "--account=nn0000k", "--partition=accel", "--nodes=1", "--ntasks=1", "--gpus=1",
                         "--time=00:10:00", "apptainer", "exec", str(images.x86), "ddp-bench", "report", *runs,
                         "--out", str(out)], timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Multi-Node (4 processes, 2 nodes)" in done.stdout, done.stdout
    assert done.stdout.count("(2 processes, 1 node)") == 2, done.stdout
    assert (out / "report.md").read_text().count("\n| ") >= 4 and (out / "report.csv").is_file()


def test_olivia_steps_see_srun_network_as_slurm_network_inside_the_image(twin, images):
    """The job scripts put the site's --network=disable_rdzv_get into the gate's and the training's
    environment as SLURM_NETWORK, which srun reads as --network (srun(1)); through srun and Apptainer
    the launcher in the image sees it, and sets FI_CXI_RDZV_PROTO=alt_read only then (libfabric's
    fi_cxi(7)). What the launcher decides from the environment the real srun and Apptainer hand it:"""
    decide = ("import os; from ddp_launch.fabric.defaults import rdzv_get_disabled; "
              "print(os.environ.get('SLURM_NETWORK'), rdzv_get_disabled(os.environ))")
    step = ["srun", "--partition=accel", "--nodes=1", "--ntasks=1", "apptainer", "exec", str(images.x86),
            "python3", "-c", decide]
    as_the_scripts = twin.as_user(step, env={"SLURM_NETWORK": "disable_rdzv_get"}, timeout=120)
    assert (as_the_scripts.returncode, as_the_scripts.stdout.split()) == (0, ["disable_rdzv_get", "True"]), \
        as_the_scripts.stderr
    without = twin.as_user(step, timeout=120)
    assert (without.returncode, without.stdout.split()) == (0, ["None", "False"]), without.stderr
    # The flag alone reaches the tasks as SLURM_NETWORK too (SLURM 26.05 here; srun(1) lists the variable
    # among its input variables only): an srun of one's own with the flag gets alt_read (containers/README.md).
    flag_only = twin.as_user(step[:1] + ["--network=disable_rdzv_get"] + step[1:], timeout=120)
    assert (flag_only.returncode, flag_only.stdout.split()) == (0, ["disable_rdzv_get", "True"]), flag_only.stderr


def test_olivia_script_refuses_to_start_without_staged_data(twin_cluster, images, tmp_path):
    env = twin_job_env(TWIN, images.x86, tmp_path / "nowhere", user_dir(tmp_path) / "run")

    job = submit_twin_job(twin_cluster, "slurm/olivia-multinode.sh", env, timeout=60)

    assert job.state == "FAILED"
    assert f"{tmp_path / 'nowhere'}/cifar-100-python lacks train, test, meta: run 'make data" in job.output()


def test_olivia_multinode_with_a_spare_but_no_room_for_it_stops_in_one_line_before_any_step(twin_cluster, images,
                                                                                             cifar_data, tmp_path):
    """The spare arithmetic forgotten: `DDP_SPARE_NODES=1 sbatch slurm/olivia-multinode.sh` gets the
    script's own 2 nodes, which trained on one with the 2-node global batch. Now it stops before
    anything (no step, no run dir), naming the sbatch --nodes= that holds the spare."""
    env = {**twin_job_env(TWIN, images.x86, cifar_data, user_dir(tmp_path) / "run"), "DDP_SPARE_NODES": "1"}

    job = submit_twin_job(twin_cluster, "slurm/olivia-multinode.sh", env, timeout=120)

    assert (job.state, job.exit_code) == ("FAILED", "2:0"), job.output()
    assert twin_cluster.job_nodes(job) == ["nid001000", "nid001001"]  # #SBATCH --nodes=2, as submitted
    # The batch script's whole output is the one line: no srun ran (each step says something first).
    assert job.output().splitlines() == [
        f"ddp: error: DDP_SPARE_NODES=1: job {job.job_id} has 2 node(s), too few for the 2 the job script trains "
        "on (DDP_TRAIN_NODES=2) plus 1 spare(s): submit with sbatch --nodes=3, or set DDP_TRAIN_NODES=1 to train "
        "on 1 node(s) with this allocation"]
    assert not (tmp_path / "run").exists()


def test_olivia_twin_nodes_carry_olivias_names_nic_partition_and_gpus(twin):
    done = twin.run(["srun", "--partition=accel", "--nodelist=nid001001", "--gpus-per-node=4", "sh", "-c",
                     "hostname; ls /sys/class/net; ls /dev/cxi*; echo $CUDA_VISIBLE_DEVICES; "
                     "ls /opt/cray/libfabric/*/lib64/libfabric.so.1 /usr/lib64/libcxi.so.1"], timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["nid001001", "hsn0", "lo", "/dev/cxi0", "0,1,2,3",
                                   "/opt/cray/libfabric/2.3.1/lib64/libfabric.so.1", "/usr/lib64/libcxi.so.1"]
    nodes = twin.run(["sinfo", "-h", "-N", "-o", "%N %P %G %c %m"], timeout=30).stdout.split("\n")
    assert "nid001000 accel gpu:gh200:4 288 460800" in nodes


# -- a hang, with NCCL's own view of it ---------------------------------------------------------

# The collective timeout the hang runs under: the watchdog acts at half of it.
DIST_TIMEOUT_S = 40
# After the timeout: the job script's own ending (srun ends the step, SLURM records the job).
SLACK_S = 45
HANG_RUN = ("--epochs", "30", "--batch-size", "64", "--width-scale", "0.25", "--allow-unverified-data",
            "--dist-timeout-s", str(DIST_TIMEOUT_S))
# The NCCL Olivia's module brings (twins.OLIVIA_NCCL): it runs RAS (since 2.24) and answers in text (JSON
# came in 2.28.7). The stand-in answers as it does, on NCCL's default port in each node's namespace.
OLIVIA_NCCL_VERSION = "2.27.7"
STAND_IN_RAS = REPO / "tests" / "stand_ins" / "nccl_ras.py"


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


def nccl_ras_on(cluster: Cluster, nodes: list, workers: dict, stopped: int, directory: Path) -> list:
    """The stand-in RAS on localhost:28028 of each node, describing the job as NCCL's RAS threads would
    see it once `stopped` stops: its rank missing from their gathering, every other rank's all-reduce
    count alike. The started processes, to kill."""
    ranks = [{"rank": rank, "host": cluster.address(node), "pid": pid, "gpu": rank % 2, "counts": {"AllReduce": 120}}
             for node in nodes for rank, pid in sorted(workers[node].items())]
    described = directory / "ras-job.json"
    described.write_text(json.dumps({"nccl_version": OLIVIA_NCCL_VERSION, "communicators": [{
        "hash": "0x5ea1f00d", "size": len(ranks), "ranks": [r for r in ranks if r["rank"] != stopped],
        "missing": [r for r in ranks if r["rank"] == stopped]}]}))
    started = []
    for node in nodes:
        server = subprocess.Popen(["ip", "netns", "exec", cluster.netns(node), sys.executable, str(STAND_IN_RAS),
                                   "--job", str(described), "--listen", "127.0.0.1:28028"],
                                  stdout=subprocess.PIPE, text=True)
        started.append(server)
        assert server.stdout.readline().startswith("listening 127.0.0.1:28028"), node
    return started


def test_olivia_a_rank_stopped_mid_epoch_is_named_with_nccls_own_verdict_and_the_job_crashes(
        twin_cluster, images, cifar_data, tmp_path):
    # The preflight and the gate are off (a user may turn them off too): this is about the training's hang.
    run_dir = user_dir(tmp_path / "hang") / "run"
    env = {**twin_job_env(TWIN, images.x86, cifar_data, run_dir), **WITHOUT_CHECKS}
    job_id = twin_cluster.sbatch([f"--output={run_dir.parent}/%j.out", "slurm/olivia-multinode.sh", *HANG_RUN],
                                 env=env)
    twin_cluster.wait_for_file(run_dir, 600, predicate=lambda d: epochs_done(d) >= 1)
    nodes = twin_cluster.job_nodes(twin_cluster.job(job_id))
    workers = {node: _workers(twin_cluster, node) for node in nodes}
    assert [len(found) for found in workers.values()] == [2, 2], workers
    node = nodes[1]
    rank = max(workers[node])
    servers = nccl_ras_on(twin_cluster, nodes, workers, rank, tmp_path)
    try:
        # SIGSTOP: the process neither crashes nor answers; its peers wait in the next collective.
        subprocess.run(["kill", "-STOP", str(workers[node][rank])], check=True)
        stopped_at = time.monotonic()
        job = twin_cluster.wait(job_id, timeout=DIST_TIMEOUT_S + SLACK_S + 30)
    finally:
        for server in servers:
            server.kill()
            server.wait()
    took = time.monotonic() - stopped_at
    print(f"the job ended {took:.1f} s after rank {rank} was stopped")

    output = job.output()
    assert took < DIST_TIMEOUT_S + SLACK_S, output
    assert job.state == "FAILED", output
    assert job.exit_code.startswith("1:"), job.exit_code  # a crash: never requeued blindly
    named = re.findall(rf"ddp-launch: error: rank {rank} on {node} stopped advancing at step \d+ "
                       rf"\(.*stopped by a signal \(T\)\) at \S+:\d+ in \S+", output)
    assert len(named) == 1, output
    forensics = run_dir / "forensics"
    for r in (rank - 1, rank):  # both of the node's workers; the other node's agent writes its own
        assert "most recent call first" in (forensics / f"stacks-rank{r}.txt").read_text()
    # gloo records collectives into the Flight Recorder; the trainer dumps it when asked.
    assert (forensics / f"fr-trace-rank{rank - 1}").stat().st_size > 0
    # NCCL's verdict beside them, from the node's RAS socket, in the text of Olivia's NCCL 2.27.7; the
    # address RAS names is the node's, named as the node's /etc/hosts names it.
    saved = forensics / f"nccl-ras-{node}.txt"
    verdict = (f"ddp-launch: NCCL RAS (NCCL {OLIVIA_NCCL_VERSION}, 1 communicator(s); a text report: JSON needs "
               f"NCCL 2.28.7): rank(s) {rank} missing (process {workers[node][rank]} on {node}); "
               f"node(s): {node}; its report: {saved}")
    assert verdict in output, output
    assert f"Rank {rank} -- GPU" in saved.read_text()


def test_olivia_own_script_stops_at_its_time_limit_checkpoints_is_requeued_and_resumes_at_the_right_step(olivia_jobs):
    """The README's own-script line for Olivia, word for word: examples/argparse_torchrun.py, strict argparse
    and torchrun's ranks, taking part in the contract (ddp_contract.workload). USR2 at the time limit reaches
    it through DDP_STOP_REQUEST; every rank agrees on the stop, rank 0 writes the checkpoint, the script exits
    75, the job script requeues the job, and the requeued run resumes at the step after the stop."""
    job, run_dir, output = olivia_jobs[OWN_SCRIPT]
    assert job.state == "COMPLETED", output
    assert job.fields.get("Restarts") == "1", job.fields
    marks = ["(restart 0)", "ddp: SIGUSR2 reached the batch script: asked the training step to checkpoint and stop",
             "stop requested (SIGUSR2) at step 0: checkpoint", "requeuing job", "(restart 1)",
             "resumed at step 1 from", "done: 200 steps"]
    places = [output.find(mark) for mark in marks]
    assert -1 not in places and places == sorted(places), list(zip(marks, places))
    assert "world size 2, backend gloo, steps 0-199" in output and "world size 2, backend gloo, steps 1-199" in output
    assert not (run_dir / ".ddp-stop-request").exists()
    # Before each run, the preflight checked the script in the node's container and the fabric gate ran.
    assert output.count("preflight: ddp-launch doctor passed on every node") == 2, output
    assert len(re.findall(r"fabric gate: PASS in", output)) == 2, output
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["workload"]["args"] == ["--steps", "200"]  # no trainer flags, no --data-dir or --run-dir
