"""The job output names the head node and its address, once per job, as the clusters' own job
scripts echo them (the PyTorch on Olivia guide's multi-node script prints the head node and its IP)."""

from __future__ import annotations

import os

from launch_envs import olivia, plan_for, raven, runai, six_node_ethernet

from ddp_launch import cli
from ddp_launch.plan import LaunchPlan


def test_the_head_node_announces_itself_and_its_address():
    plan = plan_for(olivia(0))
    assert plan.announcement == ("ddp-launch: job 771234, 2 nodes: head node olivia-gh001 "
                                 "(first of SLURM_STEP_NODELIST) = 10.10.0.1, port 22340")


def test_the_other_nodes_say_nothing_so_it_is_one_line_per_job():
    assert plan_for(olivia(1)).announcement is None


def test_in_task_mode_only_rank_0_announces():
    assert "= 10.20.0.123" in plan_for(raven(0), "--mode", "slurm-task").announcement
    assert plan_for(raven(5), "--mode", "slurm-task").announcement is None


def test_the_ethernet_head_announces_its_routable_address():
    assert "head node master-node (first of SLURM_STEP_NODELIST) = 192.168.20.15" in plan_for(six_node_ethernet(0)).announcement


def test_runai_master_pod_announces_the_rendezvous_and_a_worker_pod_what_it_joins():
    # A pod has a log of its own (`runai logs`, `kubectl logs POD`), and the trainer prints from rank 0
    # alone: a worker pod's log says what its workers are doing, once, before they start.
    assert plan_for(runai(0)).announcement.startswith("ddp-launch: 2 pods: rendezvous host")
    assert plan_for(runai(1), "--log-dir", "/runs/r/logs").announcement == (
        "ddp-launch: pod 1 of 2 joins the rendezvous (rendezvous host 10.96.0.10 (MASTER_ADDR) = 10.96.0.10, "
        "port 23456) with 4 worker(s); the progress is printed by rank 0 alone, in the log of the pod that hosts "
        "the rendezvous; its workers log to /runs/r/logs/pod1")


def test_the_line_is_printed_before_exec_and_not_in_the_dry_run(monkeypatch, capsys):
    def no_exec(*args):
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(os, "execvpe", no_exec)
    plan = LaunchPlan("slurm-node", ("torchrun",), announcement="ddp-launch: job 7, 2 nodes: head node n1 = 10.0.0.1, port 20070")
    assert cli.execute(plan, {}) == cli.EXIT_CANNOT_EXEC
    assert capsys.readouterr().err.startswith("ddp-launch: job 7, 2 nodes: head node n1 = 10.0.0.1, port 20070\n")
    assert "job 7" not in plan.render_text()
