"""slurm/ethernet-*.sh on the plain-Ethernet cluster's twin, unchanged and with their own site (generic).

The twin (tests/e2e/cluster/twins/ethernet.sh): master-node and node01-node05, each dual-homed (a
default-route eno1 on the site network, the cluster network on ens1f1, each its own subnet), with
Debian's /etc/hosts line that maps each host's own name to 127.0.1.1, and a GPU a node in gres. The
head node, master-node, resolves its own name to loopback: the workers must still meet on ens1f1.
ethernet-gloo.sh runs as it is, on the 6 nodes it asks for, with the CPU image; ethernet-nccl.sh on 2,
as the README's quick start submits it (`sbatch --nodes=2`), with the x86_64 image and CPU workers in
place of its GPUs.
"""
from __future__ import annotations

import json
import re

import pytest
import twins
from conftest import (TwinJob, container_versions, doctor_reports, fake_nvidia_smi_env, metrics_records,
                      own_script_job, quick_start_job, submit_twin_job, submit_twin_jobs, twin_job_env, user_dir)

pytestmark = pytest.mark.e2e

TWIN = twins.ETHERNET


def _rank0_environment(output: str) -> str:
    return re.search(r"^master-node:rank0: Environment: (.*)$", output, re.M).group(1)


def test_ethernet_gloo_trains_on_all_six_nodes_over_the_cluster_network(twin_cluster, images, cifar_data, tmp_path):
    run_dir = user_dir(tmp_path) / "run"

    # Six nodes' preflight, gate and training steps on this machine's 2 cores, beside the rest of `make test`:
    # in CI the default 600 s ran out.
    job = submit_twin_job(twin_cluster, "slurm/ethernet-gloo.sh", twin_job_env(TWIN, images.cpu, cifar_data, run_dir),
                          timeout=900)

    output = job.output()
    assert job.state == "COMPLETED", output
    assert "Number of nodes: 6" in output and "World size: 6" in output and "Training completed successfully." in output
    assert twin_cluster.job_nodes(job) == ["master-node", "node01", "node02", "node03", "node04", "node05"]
    # On master-node its own name is 127.0.1.1: the interface is the one that routes to the other nodes.
    assert "GLOO_SOCKET_IFNAME=ens1f1 NCCL_SOCKET_IFNAME=ens1f1" in _rank0_environment(output)
    run = [r for r in metrics_records(run_dir) if r["type"] == "run"][-1]
    assert {k: run["versions"][k] for k in ("python", "torch")} == container_versions(images.cpu)


NODES = ("master-node", "node01", "node02", "node03", "node04", "node05")


@pytest.fixture(scope="module")
def nccl_jobs(twin, images, cifar_data, tmp_path_factory):
    """ethernet-nccl.sh on 2 nodes, whose first node's GPU is slowed down hot in the preflight's first
    reading and not in its second (the fake nvidia-smi), and beside it, on a third node, a 1-node run
    whose own GPU has an uncorrectable ECC error, with DDP_MAX_REQUEUES=0 so that it stops after the
    preflight instead of training elsewhere; and on two more, the README's own-script quick start for this
    cluster: examples/slurm_ranks.py, ranks from SLURM's variables and MASTER_ADDR its own, 2 CPU workers a
    node under torchrun. Submitted at once: {"transient" | "sick" | "own": (Job, run dir)}."""
    transient = fake_nvidia_smi_env(tmp_path_factory.mktemp("nvidia-smi-transient"),
                                    {"master-node": "one-gpu-thermal-slowdown>one-gpu-healthy",
                                     "node01": "one-gpu-healthy"})
    sick = fake_nvidia_smi_env(tmp_path_factory.mktemp("nvidia-smi-sick"), {node: "one-gpu-ecc" for node in NODES})
    runs = {name: user_dir(tmp_path_factory.mktemp(name)) / "run" for name in ("transient", "sick", "own")}
    # The 2-node run as the README's quick start submits it: sbatch --nodes=2 slurm/ethernet-nccl.sh.
    jobs = {"transient": quick_start_job(TWIN, {**twin_job_env(TWIN, images.x86, cifar_data, runs["transient"]),
                                                **transient}),
            "sick": TwinJob("slurm/ethernet-nccl.sh", {**twin_job_env(TWIN, images.x86, cifar_data, runs["sick"]), **sick,
                                                       "DDP_MAX_REQUEUES": "0"}, ("--nodes=1",)),
            "own": own_script_job(TWIN, twin_job_env(TWIN, images.x86, cifar_data, runs["own"]), runs["own"])}
    assert jobs["transient"].script == "slurm/ethernet-nccl.sh" and jobs["transient"].sbatch_extra == ("--nodes=2",)
    assert jobs["own"].script == "slurm/ethernet-nccl.sh" and jobs["own"].args[:2] == ("--script", "examples/slurm_ranks.py")
    ended = submit_twin_jobs(twin, jobs)
    return {name: (ended[name], jobs[name].run_dir) for name in jobs}


def test_ethernet_nccl_trains_on_two_dual_homed_nodes_with_infiniband_off(nccl_jobs):
    job, run_dir = nccl_jobs["transient"]

    output = job.output()
    assert job.state == "COMPLETED", output
    assert "Number of nodes: 2" in output and "World size: 4" in output and "Training completed successfully." in output
    assert "GLOO_SOCKET_IFNAME=ens1f1 NCCL_SOCKET_IFNAME=ens1f1" in _rank0_environment(output)
    reports = doctor_reports(run_dir, job)
    assert sorted(reports) == ["master-node", "node01"]
    for node, checks in reports.items():
        assert checks["head node"]["status"] == "OK", (node, checks["head node"])
        assert checks["gpus"]["status"] == "WARN" and "1 granted" in checks["gpus"]["detail"], checks["gpus"]


def test_ethernet_a_slowdown_gone_by_the_preflights_second_reading_costs_no_requeue(nccl_jobs):
    job, run_dir = nccl_jobs["transient"]
    assert job.state == "COMPLETED", job.output()
    health = doctor_reports(run_dir, job)["master-node"]["gpu health"]
    assert health["status"] == "OK", health
    assert ("clock slowdown: GPU 0 (00000000:00:06.0) clocks_event_reasons/clocks_event_reason_sw_thermal_slowdown="
            "Active in a first reading passed within 5 s (a momentary state, not a fault)") in health["detail"], health
    assert "bad node(s)" not in job.output()


def test_ethernet_a_jobs_own_sick_gpu_names_its_node_and_the_job_stops_after_the_preflight(twin_cluster, nccl_jobs):
    job, run_dir = nccl_jobs["sick"]
    output = job.output()
    assert job.state == "FAILED" and job.exit_code == "76:0", output
    (node,) = twin_cluster.job_nodes(job)
    assert (f"excluded {node} (named by the doctor in job {job.job_id}, restart 0): gpu health: uncorrectable ECC "
            "errors: GPU 0 (00000000:00:06.0) ecc_errors/volatile/dram_uncorrectable=2") in output
    assert f"bad node(s) {node} named, but already requeued 0 times (DDP_MAX_REQUEUES=0): not requeuing" in output
    assert "fabric gate:" not in output and "Epoch " not in output  # it stopped before the gate and the training
    health = doctor_reports(run_dir, job)[node]["gpu health"]
    assert f"`--exclude={node}`" in health["fix"] and "support" in health["fix"]
    assert "<dram_uncorrectable>2</dram_uncorrectable>" in health["evidence"]


def test_ethernet_twin_head_resolves_itself_to_127_0_1_1_and_routes_by_default_through_eno1(twin):
    # Its own name's first address is the loopback line (glibc's files backend answers in file order;
    # Debian's /etc/host.conf "multi on" lists the cluster line after it).
    done = twin.node_exec("master-node", ["sh", "-c", "getent hosts master-node | head -n 1; getent hosts node01; "
                                                      "ip -4 -o route show default; ls /sys/class/net"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["127.0.1.1", "master-node"]
    assert lines[1].split() == [twin.address("node01"), "node01"]
    assert lines[2].split()[:5] == ["default", "via", f"{twin.env['DDP_E2E_UPLINK_SUBNET']}.1", "dev", "eno1"]
    assert lines[3:] == ["eno1", "ens1f1", "lo"]


def test_ethernet_own_script_reading_slurms_ranks_trains_as_one_job_of_four_ranks(twin_cluster, nccl_jobs):
    """The README's own-script line for this cluster, word for word: a script written for srun (ranks from
    SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, MASTER_ADDR and MASTER_PORT its own) under torchrun's 2
    workers a node. Each worker's SLURM variables are its own, so the two nodes' four workers are one job of
    four ranks, not two jobs of two ranks each (one of which hangs); the preflight checked the script in each
    node's container and the fabric gate ran our own module before it."""
    job, run_dir = nccl_jobs["own"]
    output = job.output()
    assert job.state == "COMPLETED", output
    first = twin_cluster.job_nodes(job)[0]  # the step's first node, where torchrun ranks its nodes from (by name)
    assert f"ranks [0, 1, 2, 3] of 4 (SLURM_NTASKS), local ranks [0, 1, 0, 1] (SLURM_LOCALID), MASTER_ADDR={first}" \
        in output, output
    assert "done: 200 steps" in output
    assert re.search(r"fabric gate: PASS in [\d.]+ s on 2 node\(s\), 4 ranks", output), output
    for node, checks in doctor_reports(run_dir, job).items():
        assert checks["workload"]["status"] == "OK" and checks["workload"]["detail"].endswith(
            "/examples/slurm_ranks.py is readable here"), (node, checks["workload"])
        assert checks["dataset"]["status"] == "SKIP", (node, checks["dataset"])
    # No trainer flags reached it (its strict argparse would have exited 2), and rank 0 wrote what ran.
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["workload"]["args"] == ["--steps", "200"]
    assert manifest["environment"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["set_by"].startswith("launcher: --script ")
