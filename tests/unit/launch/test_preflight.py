"""`ddp-launch preflight`: a pod's doctor and fabric gate, one verdict in every pod, then the training.

The reports are doctor's own JSON (ddp_launch.doctor.render_json of real Check values) and the
gate's report its gate.json shape (ddp_train.gate.judge.GateReport, read by ddp_contract.quarantine).
The pods' children (doctor, the gate's launch) and the final exec are recorded, not run: the pod
twin runs them for real (tests/e2e/test_twin_rcp.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ddp_contract import EXIT_BAD_NODE, EXIT_USAGE
from ddp_contract.quarantine import doctor_failures
from ddp_launch import preflight
from ddp_launch.doctor import FAIL, OK, WARN, Check, render_json
from ddp_launch.errors import LaunchError
from launch_envs import facts_for

PASS = render_json([Check("launch plan", OK, "kubeflow on 2 node(s)"), Check("gpus", WARN, "no GPUs visible")])
NO_GPU = render_json([Check("launch plan", FAIL, "RUNAI_NUM_OF_GPUS=1 granted 1 GPU(s) but CUDA cannot use any",
                            "fix what the message names"),
                      Check("gpus", FAIL, "0 GPUs visible (torch.cuda.device_count()) but 1 granted",
                            "check that the pod requests nvidia.com/gpu")])
NO_DATA = render_json([Check("fabric settings", FAIL, "NCCL_NET=IB and NCCL_NET_PLUGIN=ofi are both set",
                             "unset NCCL_NET_PLUGIN")])
SICK = render_json([Check("gpu health", FAIL, "GPU 0: 2 uncorrectable ECC errors", "send it to the site")])


def verdict(**texts: str):
    return preflight.doctor_verdict({pod: doctor_failures(text) for pod, text in texts.items()}, 2)


def test_a_check_failing_in_every_pod_is_the_setups_one_line_exit_2_naming_no_pod():
    found = verdict(**{"job-master-0": NO_DATA, "job-worker-0": NO_DATA})
    assert found.code == EXIT_USAGE
    assert found.lines == ("preflight: ddp-launch doctor fails 'fabric settings' in every pod of the job (2 of 2): "
                           "NCCL_NET=IB and NCCL_NET_PLUGIN=ofi are both set: a setup problem, not a bad pod, so no "
                           "pod is named; fix: unset NCCL_NET_PLUGIN",)


def test_a_pod_failing_alone_is_named_and_every_pod_stops_with_76():
    found = verdict(**{"job-master-0": PASS, "job-worker-0": NO_GPU})
    assert found.code == EXIT_BAD_NODE
    assert found.lines[0].startswith("preflight: bad pod job-worker-0: ddp-launch doctor fails 'launch plan': ")
    assert "'gpus': 0 GPUs visible (torch.cuda.device_count()) but 1 granted (fix: check that the pod requests " \
           "nvidia.com/gpu)" in found.lines[0]
    assert found.lines[1].startswith("preflight: every pod of the job stops (exit 76): ")
    assert "OnFailure" in found.lines[1] and "ExitCode" in found.lines[1] and len(found.lines) == 2


def test_every_pod_passing_goes_on():
    assert verdict(**{"job-master-0": PASS, "job-worker-0": PASS}).code == 0


def test_a_pod_that_did_not_report_in_time_is_said_and_the_others_are_judged_without_a_setup_verdict():
    found = verdict(**{"job-master-0": NO_DATA})
    assert found.code == EXIT_BAD_NODE  # one pod's failure, though the missing one might have failed it too
    assert found.lines[0] == ("preflight: 1 of 2 pods reported in time: the others are not judged (the rendezvous "
                              "waits for them)")
    garbled = verdict(**{"job-master-0": NO_DATA, "job-worker-0": "Traceback (most recent call last):\n"})
    assert garbled.lines[0] == "preflight: no doctor report from pod job-worker-0 (see its log): not judged"
    assert garbled.code == EXIT_BAD_NODE


def test_a_pod_judged_alone_is_the_setups_unless_its_own_hardware_fails():
    # quarantine.setup_problem's rule: one node cannot tell its fault from the setup's, but for its GPUs' health.
    assert preflight.doctor_verdict({"p": doctor_failures(NO_DATA)}, 1).code == EXIT_USAGE
    assert "in the job's only pod (p)" in preflight.doctor_verdict({"p": doctor_failures(NO_DATA)}, 1).lines[0]
    assert preflight.doctor_verdict({"p": doctor_failures(SICK)}, 1).code == EXIT_BAD_NODE


def gate_report(bad: list, faults: list) -> dict:
    return {"ok": not faults, "bad_nodes": bad, "faults": faults}


def test_the_gate_names_a_pod_as_the_doctor_does():
    report = gate_report(["job-worker-0"], [{"kind": "slow", "nodes": ["job-worker-0"], "measured": "busbw 0.2 GB/s",
                                             "expected": ">= 10 GB/s", "cause": "RoCE down"}])
    found = preflight.gate_verdict(EXIT_BAD_NODE, report, "/runs/r")
    assert found.code == EXIT_BAD_NODE
    assert found.lines[0] == ("preflight: bad pod job-worker-0: the fabric gate measured busbw 0.2 GB/s "
                              "(expected >= 10 GB/s); likely cause: RoCE down")
    assert preflight.gate_verdict(0, None, "/runs/r") == preflight.Verdict(0, ("preflight: the fabric gate passed",))
    failed = preflight.gate_verdict(1, None, "/runs/r")
    assert failed.code == 1 and "without naming a pod: see /runs/r/gate.txt" in failed.lines[0]
    assert preflight.gate_verdict(EXIT_USAGE, None, "/runs/r") == preflight.Verdict(EXIT_USAGE, ())


def test_the_gate_meets_on_a_port_of_its_own_with_the_trainers_backend_and_its_own_logs():
    assert preflight.trainer_backend(["--epochs", "1", "--backend", "gloo"]) == "gloo"
    assert preflight.trainer_backend(["--backend=nccl"]) == "nccl"
    assert preflight.trainer_backend(["--epochs", "1"]) == "auto"
    assert (preflight.gate_port(29533), preflight.gate_port(65535)) == (29534, 65534)
    argv = preflight.gate_launch_argv(["--mode", "kubeflow", "--log-dir", "/r/logs", "--cpu-workers", "2",
                                       "--rdzv-port=29400"], "/r", 29534, "rcp", "gloo")
    assert argv == ["--mode", "kubeflow", "--cpu-workers", "2", "--log-dir", "/r/logs/gate", "--rdzv-port", "29534",
                    "--module", "ddp_train.gate", "--", "--run-dir", "/r", "--backend", "gloo", "--site", "rcp"]


def test_waiting_for_the_other_pods_reports_ends_when_all_are_in_or_at_the_deadline(tmp_path):
    now = [0.0]
    (tmp_path / "doctor-a.json").write_text(PASS)

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 3:
            (tmp_path / "doctor-b.json").write_text(PASS)

    assert sorted(preflight.wait_for_reports(tmp_path, 2, 60, None, lambda: now[0], sleep).fresh) == ["a", "b"]
    assert now[0] == 3
    now[0] = 0.0
    assert sorted(preflight.wait_for_reports(tmp_path, 3, 10, None, lambda: now[0], sleep).fresh) == ["a", "b"]
    assert now[0] == 10


def age(path: Path, seconds: float) -> None:
    """Set path's mtime seconds before now (the claim's clock sets it; here this machine's)."""
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime - seconds))


def test_a_report_older_than_the_attempt_is_not_judged_and_its_pod_is_waited_for(tmp_path):
    # b's container failed an hour ago and is restarting more slowly than a's: its report on the claim
    # is the failing one of the earlier attempt. a waits for b's new report instead of naming b.
    (tmp_path / "doctor-a.json").write_text(PASS)
    (tmp_path / "doctor-b.json").write_text(NO_GPU)
    age(tmp_path / "doctor-b.json", 3600)
    since = preflight.fresh_since((tmp_path / "doctor-a.json").stat().st_mtime, 600)
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 5:
            (tmp_path / "doctor-b.json").write_text(PASS)  # b's doctor of this attempt

    found = preflight.wait_for_reports(tmp_path, 2, 600, since, lambda: now[0], sleep)
    assert sorted(found.fresh) == ["a", "b"] and found.fresh["b"] == PASS and now[0] == 5
    assert preflight.doctor_verdict({pod: doctor_failures(text) for pod, text in found.fresh.items()}, 2,
                                    found.earlier).code == 0


def test_a_report_the_pods_could_still_be_waiting_for_is_this_attempts(tmp_path):
    # Written 10 minutes before this pod's: its pod waits the launch's join timeout (20 minutes) for this one.
    (tmp_path / "doctor-a.json").write_text(PASS)
    (tmp_path / "doctor-b.json").write_text(NO_GPU)
    age(tmp_path / "doctor-b.json", 600)
    since = preflight.fresh_since((tmp_path / "doctor-a.json").stat().st_mtime, 1200)
    found = preflight.read_reports(tmp_path, since)
    assert sorted(found.fresh) == ["a", "b"] and found.earlier == ()


def test_an_earlier_attempts_report_never_replaced_is_said_and_names_no_pod(tmp_path):
    (tmp_path / "doctor-a.json").write_text(PASS)
    (tmp_path / "doctor-b.json").write_text(NO_GPU)
    age(tmp_path / "doctor-b.json", 3600)
    since = preflight.fresh_since((tmp_path / "doctor-a.json").stat().st_mtime, 600)
    now = [0.0]
    found = preflight.wait_for_reports(tmp_path, 2, 600, since, lambda: now[0],
                                       lambda seconds: now.__setitem__(0, now[0] + seconds))
    assert found.fresh.keys() == {"a"} and found.earlier == ("b",) and now[0] == 600
    verdict = preflight.doctor_verdict({pod: doctor_failures(text) for pod, text in found.fresh.items()}, 2,
                                       found.earlier)
    assert verdict.code == 0 and not any("bad pod" in line for line in verdict.lines)
    assert verdict.lines[0] == ("preflight: the doctor report of pod b is an earlier attempt's (written longer before "
                                "this pod's than the pods wait for each other), and none of this attempt's came in "
                                "time: not judged")


# -- the whole command, its children recorded ---------------------------------------------------

class RecordedChildren(preflight.Children):
    """doctor answers `doctor`; the gate's launch exits `gate` and leaves `gate_json` in the run dir."""

    def __init__(self, doctor: str, gate: int = 0, gate_json: dict | None = None, run_dir: Path | None = None):
        super().__init__()
        self.doctor, self.gate, self.gate_json, self.run_dir, self.argvs = doctor, gate, gate_json, run_dir, []

    def run(self, argv, **kwargs):
        self.argvs.append(list(argv))
        if "doctor" in argv:
            return subprocess.CompletedProcess(argv, 1 if '"FAIL"' in self.doctor else 0, self.doctor)
        if self.gate_json is not None:
            (self.run_dir / "gate.json").write_text(json.dumps(self.gate_json))
        return subprocess.CompletedProcess(argv, self.gate, None)

    def stop_on_signals(self):
        pass


# A RunAI master pod: rank 0 of 2, the master pod's address in MASTER_ADDR.
POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "10.96.0.10", "MASTER_PORT": "29533", "RUNAI_NUM_OF_GPUS": "0",
           "RUNAI_JOB_NAME": "ddp-train", "RUNAI_JOB_UUID": "6fb7f0fa"}


def run(argv, env, children):
    """preflight.run on this pod's facts, built by hand (launch_envs.facts_for), not this machine's."""
    launch = argv[argv.index("--") + 1:]
    return preflight.run(argv, env, children, probe=lambda asked: facts_for(env, *launch, hostname="ddp-train-master-0"))


@pytest.fixture
def pod(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    execs = []
    monkeypatch.setattr(preflight.os, "execv", lambda path, argv: execs.append(argv))
    monkeypatch.setattr(preflight.socket, "gethostname", lambda: "ddp-train-master-0")
    argv = ["--data-dir", str(tmp_path / "data"), "--run-dir", str(run_dir), "--",
            "--mode", "kubeflow", "--log-dir", str(run_dir / "logs"), "--", "--run-dir", str(run_dir), "--epochs", "1"]
    reports = run_dir / "preflight" / "ddp-train_6fb7f0fa"
    reports.mkdir(parents=True)
    return run_dir, argv, execs, reports


def test_every_pod_passing_runs_the_gate_on_its_own_port_then_execs_the_training(pod, capsys):
    run_dir, argv, execs, reports = pod
    (reports / "doctor-ddp-train-worker-0.json").write_text(PASS)  # the other pod's, on the shared claim
    children = RecordedChildren(PASS)

    assert run(argv, POD_ENV, children) == 127  # what follows a (recorded) exec

    doctor, gate = children.argvs
    assert doctor[-4:] == ["doctor", "--json", "--data-dir", argv[1]]
    assert (reports / "doctor-ddp-train-master-0.json").read_text() == PASS
    assert gate[3:] == ["--mode", "kubeflow", "--log-dir", f"{run_dir}/logs/gate", "--rdzv-port", "29534",
                        "--module", "ddp_train.gate", "--", "--run-dir", str(run_dir), "--backend", "auto"]
    assert execs == [[preflight.sys.executable, "-m", "ddp_launch", *argv[argv.index("--") + 1:]]]
    err = capsys.readouterr().err
    assert "preflight: ddp-launch doctor passed in every pod (2)" in err and "the fabric gate passed" in err


def test_an_hour_old_failing_report_of_another_pod_does_not_stop_a_restarted_pod(pod, capsys, monkeypatch):
    # The scenario of a restart: the worker pod failed an attempt ago and its report is still on the claim;
    # the master's container restarted first. It waits for the worker's new report, which passes.
    run_dir, argv, execs, reports = pod
    stale = reports / "doctor-ddp-train-worker-0.json"
    stale.write_text(NO_GPU)
    age(stale, 3600)

    def worker_reports(seconds):
        stale.write_text(PASS)

    monkeypatch.setattr(preflight.time, "sleep", worker_reports)
    assert run(argv, POD_ENV, RecordedChildren(PASS)) == 127 and len(execs) == 1
    err = capsys.readouterr().err
    assert "bad pod" not in err and "preflight: ddp-launch doctor passed in every pod (2)" in err


def test_a_known_slowdown_of_a_pods_stack_trains_and_is_said_with_its_pods(pod, capsys):
    # The doctor's WARN for a known issue (ddp_contract.known_issues): the pods train, and every pod's log
    # says which pods have it, as a SLURM job's preflight does (ddp_contract.quarantine, known_issue_warnings).
    run_dir, argv, execs, reports = pod
    slow = render_json([Check("launch plan", OK, "kubeflow on 2 node(s)"),
                        Check("known issue nccl-2.26-gh200-c2c", WARN, "NCCL 2.26.6 on GH200: C2C GDR off",
                              "set NCCL_NET_GDR_C2C=1")])
    (reports / "doctor-ddp-train-worker-0.json").write_text(slow)

    assert run(argv, POD_ENV, RecordedChildren(slow)) == 127 and len(execs) == 1
    err = capsys.readouterr().err.splitlines()
    assert ("preflight: warning: known issue nccl-2.26-gh200-c2c on pods ddp-train-master-0, ddp-train-worker-0: "
            "NCCL 2.26.6 on GH200: C2C GDR off; fix: set NCCL_NET_GDR_C2C=1") in err
    assert "preflight: ddp-launch doctor passed in every pod (2)" in err


def test_a_bad_pod_stops_every_pod_before_the_gate_and_the_training(pod, capsys):
    run_dir, argv, execs, reports = pod
    (reports / "doctor-ddp-train-worker-0.json").write_text(NO_GPU)
    children = RecordedChildren(PASS)

    assert run(argv, POD_ENV, children) == EXIT_BAD_NODE
    assert len(children.argvs) == 1 and execs == []  # doctor only: no gate, no training
    assert "preflight: bad pod ddp-train-worker-0: ddp-launch doctor fails 'launch plan'" in capsys.readouterr().err


def test_a_pod_the_gate_names_stops_every_pod(pod, capsys):
    run_dir, argv, execs, reports = pod
    (reports / "doctor-ddp-train-worker-0.json").write_text(PASS)
    named = gate_report(["ddp-train-worker-0"], [{"kind": "corrupt", "nodes": ["ddp-train-worker-0"],
                                                  "measured": "3 wrong elements", "expected": "0", "cause": "memory"}])
    children = RecordedChildren(PASS, gate=EXIT_BAD_NODE, gate_json=named, run_dir=run_dir)

    assert run(argv, POD_ENV, children) == EXIT_BAD_NODE and execs == []
    assert "preflight: bad pod ddp-train-worker-0: the fabric gate measured 3 wrong elements" in capsys.readouterr().err


def test_a_run_dir_another_job_holds_stops_the_pod_before_doctor(pod):
    run_dir, argv, execs, _ = pod
    (run_dir / ".ddp-run.lock").write_text(json.dumps({"job": "other/1", "host": "elsewhere", "pid": 1}))
    children = RecordedChildren(PASS)
    with pytest.raises(LaunchError, match=r"^--run-dir .* is in use by job other/1 on elsewhere"):
        run(argv, POD_ENV, children)
    assert children.argvs == [] and execs == []


def test_its_own_jobs_lock_from_a_restarted_container_does_not_stop_it(pod):
    run_dir, argv, execs, reports = pod
    # An earlier container of this pod: the same workload, PID 1, another PID namespace.
    (run_dir / ".ddp-run.lock").write_text(json.dumps({"job": "ddp-train/6fb7f0fa", "host": "ddp-train-master-0",
                                                       "pid": 1, "pid_space": "boot/1"}))
    (reports / "doctor-ddp-train-worker-0.json").write_text(PASS)
    assert run(argv, POD_ENV, RecordedChildren(PASS)) == 127 and len(execs) == 1


def test_the_skips_and_a_launch_that_is_not_a_pods(pod):
    run_dir, argv, execs, _ = pod
    children = RecordedChildren(NO_GPU)
    assert run(argv, {**POD_ENV, "DDP_PREFLIGHT": "0", "DDP_FABRIC_GATE": "0"}, children) == 127
    assert children.argvs == [] and len(execs) == 1
    slurm = [*argv[:argv.index("--") + 1], "--mode", "local"]
    with pytest.raises(LaunchError, match=r"^ddp-launch preflight runs in a RunAI/Kubeflow pod"):
        run(slurm, POD_ENV, children)


# Kubeflow's elastic PyTorchJob (elasticPolicy minReplicas 1, maxReplicas 2): worker-0 hosts the rendezvous
# (PET_RDZV_ENDPOINT, at 10.96.0.30 in the fake name table), this pod is worker-1, scaled up or restarted
# while worker-0 trains.
ELASTIC_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d",
               "PET_RDZV_ENDPOINT": "elastic-job-worker-0:29533", "RUNAI_NUM_OF_GPUS": "0", "RUNAI_JOB_NAME": "ddp-train",
               "RUNAI_JOB_UUID": "6fb7f0fa"}


def run_elastic(argv, env, children, answers, hostname="elastic-job-worker-1"):
    """preflight.run for an elastic pod; answers: the ports of the rendezvous host that accept, in each
    round of asking (the gate's port, then the training's)."""
    launch = argv[argv.index("--") + 1:]
    asked = []

    def connect(address, port):
        asked.append((address, port))
        accepting = answers[0] if answers else ()
        if port == 29533 and answers:
            answers.pop(0)  # the round's last question
        return port in accepting

    code = preflight.run(argv, env, children, probe=lambda q: facts_for(env, *launch, hostname=hostname),
                         connect=connect)
    return code, asked


def test_a_late_elastic_pod_runs_no_gate_and_joins_the_training(pod, capsys, monkeypatch):
    run_dir, argv, execs, _ = pod
    children = RecordedChildren(PASS)
    monkeypatch.setattr(preflight.time, "sleep", lambda seconds: None)
    # The host is between its gate and its training at first (nothing answers), then trains.
    code, asked = run_elastic(argv, ELASTIC_ENV, children, [(), (29533,)])
    assert code == 127 and len(execs) == 1  # the training's launch, exec'd
    assert all("ddp_train.gate" not in a for a in children.argvs) and len(children.argvs) == 1  # doctor only
    assert asked == [("10.96.0.30", 29534), ("10.96.0.30", 29533), ("10.96.0.30", 29534), ("10.96.0.30", 29533)]
    err = capsys.readouterr().err
    assert err.count("preflight: waiting for the rendezvous host 10.96.0.30 to open the fabric gate's rendezvous "
                     "(port 29534) or the training's (port 29533), at most 600 s") == 1
    assert ("preflight: pod elastic-job-worker-1 joins the elastic job ddp-train/6fb7f0fa late: its pods already train "
            "(the training's rendezvous at 10.96.0.30:29533 answers, the fabric gate's at port 29534 is gone), so "
            "this pod runs no gate") in err


def test_an_elastic_pod_that_finds_the_gates_rendezvous_open_joins_the_gate(pod, monkeypatch):
    run_dir, argv, execs, _ = pod
    children = RecordedChildren(PASS)
    code, asked = run_elastic(argv, ELASTIC_ENV, children, [(29534, 29533)])
    assert code == 127 and any("ddp_train.gate" in a for a in children.argvs) and asked == [("10.96.0.30", 29534)]


def test_the_elastic_rendezvous_host_asks_no_one(pod):
    run_dir, argv, execs, _ = pod
    children = RecordedChildren(PASS)
    code, asked = run_elastic(argv, ELASTIC_ENV, children, [(29533,)], hostname="elastic-job-worker-0")
    assert code == 127 and asked == [] and any("ddp_train.gate" in a for a in children.argvs)


def test_a_static_jobs_pod_asks_no_one(pod):
    run_dir, argv, execs, reports = pod
    (reports / "doctor-ddp-train-worker-0.json").write_text(PASS)
    children = RecordedChildren(PASS)
    code, asked = run_elastic(argv, POD_ENV, children, [(29533,)], hostname="ddp-train-master-0")
    assert code == 127 and asked == [] and any("ddp_train.gate" in a for a in children.argvs)


def test_ddp_launch_has_the_preflight_subcommand_and_its_missing_flags_are_one_line(capsys):
    from ddp_launch import cli
    assert cli.main(["preflight", "--site", "rcp"]) == EXIT_USAGE
    assert capsys.readouterr().err == ("ddp-launch: error: preflight: the following arguments are required: "
                                       "--run-dir\n")
