"""The quarantine record (entrypoints/ddp_contract/quarantine.py): what the gate and the doctor
name, merged across requeues, and whether enough healthy nodes are left."""
import json

import pytest
from ddp_contract import EXIT_BAD_NODE
from ddp_contract import quarantine as q


def _gate_json(tmp_path, bad, faults):
    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"ok": False, "bad_nodes": bad, "faults": faults}))
    return str(path)


def _fault(nodes, measured="busbw 0.01 GB/s"):
    return {"kind": "slow", "nodes": nodes, "measured": measured, "expected": ">= 1 GB/s", "cause": "a slow NIC"}


def test_the_gate_names_single_nodes_and_never_both_ends_of_a_link(tmp_path):
    report = _gate_json(tmp_path, ["node3"], [_fault(["node3"]), _fault(["node1", "node2"])])
    named = q.collect("gate", [report], "7", 0)
    assert named == [q.Excluded("node3", "gate", "busbw 0.01 GB/s (expected >= 1 GB/s); likely cause: a slow NIC",
                                "7", 0)]


def test_the_doctor_names_the_nodes_whose_report_has_a_fail(tmp_path):
    (tmp_path / "doctor-node1.json").write_text(json.dumps({"ok": True, "checks": []}))
    (tmp_path / "doctor-node2.json").write_text(json.dumps({"ok": False, "checks": [
        {"name": "interface", "status": "FAIL", "detail": "NCCL_SOCKET_IFNAME=eth0 matches none of lo, ens1f1"},
        {"name": "gpus", "status": "WARN", "detail": "no GPUs"}]}))
    (tmp_path / "doctor-node3.json").write_text("FATAL: could not open image\n")
    named = q.collect("doctor", sorted(str(p) for p in tmp_path.glob("doctor-*.json")), "7", 1)
    # node3's file is no report (two doctors in one file, or no image): the gate judges that node
    assert [(e.node, e.why) for e in named] == [
        ("node2", "interface: NCCL_SOCKET_IFNAME=eth0 matches none of lo, ens1f1")]


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
    named = q.collect("roll-call", [_roll_call_json(tmp_path, ["node2"])], "7", 0)
    assert named == [q.Excluded("node2", "roll-call", LOST, "7", 0)]
    assert named[0].line() == ("excluded node2 (named by the roll call in job 7, restart 0): lost mid-run: "
                               "none of its ranks answered the roll call after a collective failed")


def test_a_roll_call_report_that_is_not_one_names_nothing(tmp_path):
    (tmp_path / "roll-call.json").write_text("{not json")
    assert q.collect("roll-call", [str(tmp_path / "roll-call.json"), str(tmp_path / "absent.json")], "7", 0) == []
    assert q.named_by_roll_call({"lost": [{"ranks": [1]}, "node3"]}) == {}


def test_the_cli_records_a_lost_node_by_the_roll_call_and_excludes_it_on_a_requeue(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    report = _roll_call_json(tmp_path, ["node2"])
    assert q.main(["add", "--by", "roll-call", "--job", "9", str(run_dir), report]) == EXIT_BAD_NODE
    assert capsys.readouterr().out.startswith("excluded node2 (named by the roll call in job 9, restart 0)")
    assert q.main(["exclude", str(run_dir)]) == 0
    assert capsys.readouterr().out == "node2\n"
