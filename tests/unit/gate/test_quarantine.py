"""The quarantine record (entrypoints/ddp_contract/quarantine.py): what the gate and the doctor
name, merged across requeues, and whether enough healthy nodes are left."""
import json

import pytest
from ddp_contract import EXIT_BAD_NODE, EXIT_USAGE
from ddp_contract import quarantine as q


def _gate_json(tmp_path, bad, faults):
    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"ok": False, "bad_nodes": bad, "faults": faults}))
    return str(path)


def _fault(nodes, measured="busbw 0.01 GB/s"):
    return {"kind": "slow", "nodes": nodes, "measured": measured, "expected": ">= 1 GB/s", "cause": "a slow NIC"}


def test_the_gate_names_single_nodes_and_never_both_ends_of_a_link(tmp_path):
    report = _gate_json(tmp_path, ["node3"], [_fault(["node3"]), _fault(["node1", "node2"])])
    named = q.collect("gate", q.read_reports([report]), "7", 0)
    assert named == [q.Excluded("node3", "gate", "busbw 0.01 GB/s (expected >= 1 GB/s); likely cause: a slow NIC",
                                "7", 0)]


def test_the_doctor_names_the_nodes_whose_report_has_a_fail(tmp_path):
    (tmp_path / "doctor-node1.json").write_text(json.dumps({"ok": True, "checks": []}))
    (tmp_path / "doctor-node2.json").write_text(json.dumps({"ok": False, "checks": [
        {"name": "interface", "status": "FAIL", "detail": "NCCL_SOCKET_IFNAME=eth0 matches none of lo, ens1f1"},
        {"name": "gpus", "status": "WARN", "detail": "no GPUs"}]}))
    (tmp_path / "doctor-node3.json").write_text("FATAL: could not open image\n")
    named = q.collect("doctor", q.read_reports(sorted(str(p) for p in tmp_path.glob("doctor-*.json"))), "7", 1)
    # node3's file is no report (two doctors in one file, or no image): the gate judges that node
    assert [(e.node, e.why) for e in named] == [
        ("node2", "interface: NCCL_SOCKET_IFNAME=eth0 matches none of lo, ens1f1")]


def _doctor_report(*failed: tuple) -> str:
    """A `ddp-launch doctor --json` report (ddp_launch.doctor.render_json) with these FAILs and one OK."""
    checks = [{"name": "torch", "status": "OK", "detail": "2.14", "fix": ""}]
    checks += [{"name": name, "status": "FAIL", "detail": detail, "fix": fix} for name, detail, fix in failed]
    return json.dumps({"ok": not failed, "checks": checks})


OFI = ("OFI plugin", "not found in LD_LIBRARY_PATH (/opt/host-libs)", "bind the aws-ofi-nccl module's lib dir")


def test_a_check_failing_on_every_node_is_a_setup_problem_in_one_line_with_the_fix():
    reports = {node: q.doctor_failures(_doctor_report(OFI)) for node in ("node1", "node2", "node3")}

    assert q.setup_problem(reports, 3) == (
        "preflight: ddp-launch doctor fails 'OFI plugin' on every node of the job (3 of 3): not found in "
        "LD_LIBRARY_PATH (/opt/host-libs): a setup problem, not a bad node, so nothing is excluded or requeued; "
        "fix: bind the aws-ofi-nccl module's lib dir")


@pytest.mark.parametrize("reports, nodes", [
    # one node passes: the others are the nodes' own faults
    ({"node1": _doctor_report(OFI), "node2": _doctor_report()}, 2),
    # every node fails, but not the same check
    ({"node1": _doctor_report(OFI), "node2": _doctor_report(("interface", "eth0 missing", "unset it"))}, 2),
    # a node left no report (it could not run the image): not evidence of the same fault everywhere
    ({"node1": _doctor_report(OFI), "node2": "FATAL: could not open image\n"}, 2),
    # a node of the job wrote no file at all
    ({"node1": _doctor_report(OFI), "node2": _doctor_report(OFI)}, 3),
])
def test_a_fault_not_on_every_node_of_the_job_is_no_setup_problem(reports, nodes):
    assert q.setup_problem({node: q.doctor_failures(text) for node, text in reports.items()}, nodes) is None


def test_the_only_node_of_a_one_node_job_is_every_node_and_the_line_names_it_for_an_exclude():
    # The gate's rule (fabric_gate.decide): sockets on len(nodes) of len(nodes) nodes is the setup's,
    # one node included. A requeue onto another node could not tell either, and would cost a wait in
    # the queue per DDP_MAX_REQUEUES for a setup fault.
    problem = q.setup_problem({"node7": q.doctor_failures(_doctor_report(("gpus", "0 GPUs visible", "use --nv")))}, 1)

    assert problem.startswith("preflight: ddp-launch doctor fails 'gpus' on the job's only node (node7; if the "
                              "node is at fault, resubmit with sbatch --exclude=node7): 0 GPUs visible: ")


def test_a_hardware_fault_on_the_only_node_is_that_nodes_and_it_is_excluded(tmp_path, capsys):
    """An uncorrectable ECC error is the GPU's, however many nodes the job has (ddp-launch doctor's
    gpu health); on two nodes at once it would again point at the setup (the tool, the driver)."""
    ecc = ("gpu health", "uncorrectable ECC errors: GPU 2 ecc_errors/volatile/dram_uncorrectable=2", "drain it")
    assert q.setup_problem({"node7": q.doctor_failures(_doctor_report(ecc))}, 1) is None
    assert q.setup_problem({n: q.doctor_failures(_doctor_report(ecc)) for n in ("node7", "node8")}, 2) is not None
    path = tmp_path / "doctor-node7.json"
    path.write_text(_doctor_report(ecc))
    (tmp_path / "run").mkdir()

    assert q.main(["add", "--by", "doctor", "--job", "9", "--nodes", "1", str(tmp_path / "run"), str(path)]) == \
        EXIT_BAD_NODE
    assert [entry.node for entry in q.read_record(str(tmp_path / "run"))] == ["node7"]


def test_the_cli_stops_with_exit_2_and_records_nothing_when_every_node_fails_the_same_check(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reports = []
    for node in ("node1", "node2"):
        path = tmp_path / f"doctor-{node}.json"
        path.write_text(_doctor_report(OFI, ("interface", f"{node}: eth0 missing", "unset it")))
        reports.append(str(path))

    assert q.main(["add", "--by", "doctor", "--nodes", "2", str(run_dir), *reports]) == EXIT_USAGE

    assert capsys.readouterr().out.startswith("preflight: ddp-launch doctor fails 'OFI plugin' on every node")
    assert not (run_dir / q.RECORD_NAME).exists()
    # The same reports in a 3-node job (one node wrote none): the two are excluded as before.
    assert q.main(["add", "--by", "doctor", "--nodes", "3", str(run_dir), *reports]) == EXIT_BAD_NODE
    assert [e.node for e in q.read_record(str(run_dir))] == ["node1", "node2"]


def test_a_node_keeps_its_first_reason_across_requeues():
    first = q.Excluded("node2", "doctor", "interface", "7", 0)
    record, new = q.merge([first], [q.Excluded("node2", "gate", "slow", "7", 1), q.Excluded("node4", "gate", "slow", "7", 1)])
    assert record == (first, q.Excluded("node4", "gate", "slow", "7", 1))
    assert new == (q.Excluded("node4", "gate", "slow", "7", 1),)


@pytest.mark.parametrize(("excluded", "need", "nodes", "short"), [
    (["node2"], 2, ["node1", "node2", "node3"], False),
    (["node2"], 2, ["node1", "node2"], True),
    (["node2", "node3"], 1, ["node1", "node2", "node3"], False),
    ([], 3, ["node1", "node2"], True),
])
def test_a_requeue_needs_enough_nodes_outside_the_record(excluded, need, nodes, short):
    record = [q.Excluded(n, "gate", "x", "1", 0) for n in excluded]
    problem = q.shortage(record, need, nodes)
    assert (problem is not None) is short
    if short:
        assert problem.startswith(f"out of healthy nodes: the job needs {need} node(s)")


def test_the_cli_records_excludes_and_shows_across_calls(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    report = _gate_json(tmp_path, ["node3"], [_fault(["node3"])])
    assert q.main(["add", "--by", "gate", "--job", "9", "--restart", "0", str(run_dir), report]) == EXIT_BAD_NODE
    assert capsys.readouterr().out.startswith("excluded node3 (named by the gate in job 9, restart 0): busbw")
    assert q.main(["add", "--by", "gate", "--job", "9", "--restart", "1", str(run_dir), report]) == 0  # known already
    assert q.main(["exclude", str(run_dir)]) == 0
    assert capsys.readouterr().out == "node3\n"
    assert q.main(["enough", str(run_dir), "2", "node1", "node2", "node3"]) == 0
    assert q.main(["enough", str(run_dir), "3", "node1", "node2", "node3"]) == 1
    assert "out of healthy nodes" in capsys.readouterr().out
    data = json.loads((run_dir / q.RECORD_NAME).read_text())
    assert data["schema"] == 1 and [e["node"] for e in data["excluded"]] == ["node3"]


def test_no_record_yet_excludes_nothing(tmp_path, capsys):
    assert q.read_record(str(tmp_path)) == ()
    assert q.main(["exclude", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "\n"
    assert q.main([]) == 2


def _roll_call_json(tmp_path, lost):
    path = tmp_path / "roll-call.json"
    path.write_text(json.dumps({"lost": [{"node": node, "ranks": [2, 3]} for node in lost],
                                "cause": "Connection reset by peer", "failed_at": 1.0, "named_at": 16.0,
                                "message": "lost contact with node2 (ranks 2, 3): ..."}))
    return str(path)


LOST = "lost mid-run: none of its ranks answered the roll call after a collective failed"


def test_a_roll_call_names_the_lost_node(tmp_path):
    named = q.collect("roll-call", q.read_reports([_roll_call_json(tmp_path, ["node2"])]), "7", 0)
    assert named == [q.Excluded("node2", "roll-call", LOST, "7", 0)]
    assert named[0].line() == ("excluded node2 (named by the roll call in job 7, restart 0): lost mid-run: "
                               "none of its ranks answered the roll call after a collective failed")


def test_a_silent_node_whose_own_launcher_reported_a_crash_is_up_and_not_excluded(tmp_path, capsys):
    # ddp_launch/agent.py writes launcher-crash-<node>.json when its workers crashed: all of a live
    # node's workers killed at once are silent in the roll call as a lost node's are.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "launcher-crash-node2.json").write_text('{"node": "node2", "rank": 2, "exitcode": -9, "at": 3.0}')
    report = _roll_call_json(tmp_path, ["node2", "node3"])
    assert q.main(["add", "--by", "roll-call", "--job", "9", str(run_dir), report]) == EXIT_BAD_NODE
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("node2 is up: its ddp-launch reported its workers' crash (launcher-crash-node2.json): "
                      "a crash, not a lost node")
    assert out[1].startswith("excluded node3 (named by the roll call")
    assert [e.node for e in q.read_record(str(run_dir))] == ["node3"]
    # Only the up node named: nothing new, exit 0 (ddp.sh then ends the job as a crash, exit 1).
    assert q.main(["add", "--by", "roll-call", "--job", "9", str(run_dir), _roll_call_json(tmp_path, ["node2"])]) == 0
    assert [e.node for e in q.read_record(str(run_dir))] == ["node3"]


def test_a_silent_node_whose_slurmd_answered_after_the_step_is_up_and_not_excluded(tmp_path, capsys):
    # ddp.sh asks each node the roll call names for a step of `true` (ddp::slurmd_answers): one whose
    # launcher was killed (the OOM killer, its workers dying with it) answers; a lost one does not.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    report = _roll_call_json(tmp_path, ["node2", "node3"])
    assert q.main(["lost", report]) == 0
    assert capsys.readouterr().out.split() == ["node2", "node3"]
    assert q.main(["add", "--by", "roll-call", "--job", "9", "--up", "node2", str(run_dir), report]) == EXIT_BAD_NODE
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("node2 is up: its slurmd answered after the step failed (its ranks were killed, or stopped, "
                      "on a live node): a crash, not a lost node")
    assert [e.node for e in q.read_record(str(run_dir))] == ["node3"]


def test_a_roll_call_report_that_is_not_one_names_nothing(tmp_path):
    (tmp_path / "roll-call.json").write_text("{not json")
    assert q.collect("roll-call", q.read_reports([str(tmp_path / "roll-call.json"), str(tmp_path / "absent.json")]), "7", 0) == []
    assert q.named_by_roll_call({"lost": [{"ranks": [1]}, "node3"]}) == {}


def test_a_lost_node_entry_that_says_why_is_recorded_with_its_own_reason():
    # The job script's entry for a node slurmctld stopped hearing before any roll call named it (ddp.sh).
    why = "lost mid-run: slurmctld stopped hearing from it (sinfo: down*)"
    assert q.named_by_roll_call({"lost": [{"node": "node2", "ranks": [], "why": why}, {"node": "node3", "ranks": [2]}]}) == {
        "node2": why, "node3": "lost mid-run: none of its ranks answered the roll call after a collective failed"}


def test_the_cli_records_a_lost_node_by_the_roll_call_and_excludes_it_on_a_requeue(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    report = _roll_call_json(tmp_path, ["node2"])
    assert q.main(["add", "--by", "roll-call", "--job", "9", str(run_dir), report]) == EXIT_BAD_NODE
    assert capsys.readouterr().out.startswith("excluded node2 (named by the roll call in job 9, restart 0)")
    assert q.main(["exclude", str(run_dir)]) == 0
    assert capsys.readouterr().out == "node2\n"
