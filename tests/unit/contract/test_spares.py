"""Spare nodes (entrypoints/ddp_contract/spares.py): which nodes train, which spare takes a bad node's
place, when none is left, and what the job script reads back."""
import json

import pytest
from ddp_contract import EXIT_USAGE
from ddp_contract import quarantine as q
from ddp_contract import spares

ALLOCATION = ["node1", "node2", "node3", "node4", "node5"]


def _bad(*nodes, by="doctor"):
    return [q.Excluded(node, by, "interface: eth0 missing", "7", 0) for node in nodes]


def test_the_first_n_nodes_train_and_the_rest_wait_as_spares():
    placed = spares.place(ALLOCATION, 2, [])
    assert placed == spares.Placement(("node1", "node2", "node3"), tuple(ALLOCATION), ("node4", "node5"))


def test_a_bad_training_node_is_replaced_by_the_next_spare_and_the_survivors_keep_their_places():
    placed = spares.place(ALLOCATION, 2, ["node2"])
    assert placed.train == ("node1", "node3", "node4")
    assert placed.spares == ("node5",)
    assert spares.swaps(["node1", "node2", "node3"], placed, _bad("node2")) == (
        spares.Swap("node2", "doctor", "interface: eth0 missing", "node4"),)


def test_a_bad_spare_is_skipped_and_replaces_nothing():
    placed = spares.place(ALLOCATION, 2, ["node4"])
    assert placed.train == ("node1", "node2", "node3") and placed.spares == ("node5",)
    assert spares.swaps(["node1", "node2", "node3"], placed, _bad("node4")) == ()


def test_a_second_loss_after_a_first_swap_takes_the_last_spare_in_order():
    first = spares.place(ALLOCATION, 2, ["node2"])
    second = spares.place(ALLOCATION, 2, ["node2", "node1"])
    assert second.train == ("node3", "node4", "node5") and second.spares == ()
    assert [(s.node, s.spare) for s in spares.swaps(first.train, second, _bad("node2", "node1"))] == [
        ("node1", "node5")]


def test_the_batch_hosts_node_can_be_left_out_and_the_head_is_then_the_next_node():
    # The first node runs the batch script; a preflight FAIL there moves the training's first node.
    assert spares.place(ALLOCATION[:4], 1, ["node1"]).train == ("node2", "node3", "node4")


@pytest.mark.parametrize("bad", [["node2", "node4", "node5"], ["node1", "node2", "node3"]])
def test_fewer_healthy_nodes_than_training_nodes_is_no_placement(bad):
    assert spares.place(ALLOCATION, 2, bad) is None
    line = spares.shortage_line(ALLOCATION, 2, bad, _bad(*bad))
    assert line.startswith("no spare left: the training needs 3 node(s) and 2 of the allocation's 5 are healthy")
    assert "(named by the doctor)" in line and line.endswith("(DDP_SPARE_NODES=2)")


@pytest.mark.parametrize("count", [-1, 5, 6])
def test_spares_that_leave_no_training_node_are_a_usage_mistake(count):
    with pytest.raises(ValueError, match=f"DDP_SPARE_NODES={count} leaves no node to train on"):
        spares.training_count(ALLOCATION, count)


def test_a_roll_calls_report_times_the_fault_from_the_failed_collective():
    report = {"failed_at": 100.0, "named_at": 115.5}
    assert spares.fault_times(report, 200.0) == (100.0, 115.5)
    # the preflight and the gate: the fault is known when they name the node
    assert spares.fault_times(None, 200.0) == (200.0, 200.0)
    assert spares.fault_times({"failed_at": "soon"}, None) == (None, None)


def _run_dir(tmp_path, excluded):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    q.write_record(str(run_dir), excluded)
    return run_dir


def _lines(text):
    return dict(line.split("=", 1) for line in text.splitlines())


def test_the_cli_reads_the_quarantine_record_and_prints_what_the_job_script_reads(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, _bad("node2", by="roll-call"))
    report = tmp_path / "roll-call.json"
    report.write_text(json.dumps({"lost": [{"node": "node2", "ranks": [2, 3]}], "failed_at": 100.0,
                                  "named_at": 115.0}))

    assert spares.main(["place", "--previous", "node1,node2,node3", "--step-ended-at", "150",
                        "--roll-call", str(report), str(run_dir), "1", *ALLOCATION[:4]]) == 0

    out = _lines(capsys.readouterr().out)
    assert out["train"] == "node1,node3,node4" and out["healthy"] == "node1,node3,node4"
    recovery = json.loads(out["recovery"])
    assert recovery["swaps"] == [{"node": "node2", "by": "roll-call", "why": "interface: eth0 missing",
                                  "spare": "node4"}]
    assert (recovery["fault_at"], recovery["named_at"], recovery["old_step_ended_at"]) == (100.0, 115.0, 150.0)
    assert recovery["step_started_at"] > 150.0
    assert out["say"].startswith("spare node4 replaces node2 (named by the roll call: ")
    assert out["say"].endswith("training on node1,node3,node4 (3 of the allocation's 4 nodes), 0 spare(s) left")


def test_nodes_recorded_by_an_earlier_job_of_the_run_dir_are_not_trained_on(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, [q.Excluded("node1", "gate", "slow", "3", 0)])
    assert spares.main(["place", str(run_dir), "1", *ALLOCATION[:4]]) == 0
    out = _lines(capsys.readouterr().out)
    assert out["train"] == "node2,node3,node4"
    assert json.loads(out["recovery"])["fault_at"] is None  # not named in this job: no fault time


def test_no_fault_prints_an_empty_recovery_and_the_spares_left(tmp_path, capsys):
    assert spares.main(["place", str(_run_dir(tmp_path, [])), "1", *ALLOCATION[:4]]) == 0
    out = _lines(capsys.readouterr().out)
    assert out["recovery"] == "" and out["train"] == "node1,node2,node3"
    assert out["say"] == "training on node1,node2,node3 (3 of the allocation's 4 nodes), 1 spare(s) left: node4"


def test_the_cli_says_a_shortage_in_one_line_with_exit_1_and_a_bad_count_with_exit_2(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, _bad("node2", "node4"))
    assert spares.main(["place", str(run_dir), "1", *ALLOCATION[:4]]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no spare left:") and out.count("\n") == 1
    assert spares.main(["place", str(run_dir), "4", *ALLOCATION[:4]]) == EXIT_USAGE
    assert "DDP_SPARE_NODES=4 leaves no node to train on in an allocation of 4 node(s)" in capsys.readouterr().out
    assert spares.main([]) == EXIT_USAGE


# The allocation against the nodes the job script trains on (DDP_TRAIN_NODES, its #SBATCH --nodes):
# spares come on top, so `DDP_SPARE_NODES=1 sbatch slurm/olivia-multinode.sh` (2 nodes) has no room.

@pytest.mark.parametrize(("allocated", "spare_count", "train_nodes"), [
    (2, 0, 2),   # no spares: the allocation is the training, whatever --nodes said
    (1, 0, 2),   # sbatch --nodes=1 on a 2-node script without spares trains on 1, as asked
    (3, 1, 2),   # N + S
    (5, 1, 2),   # more than N + S: all but the spare train
    (2, 1, 1),   # a 1-node script with one spare: sbatch --nodes=2
])
def test_an_allocation_with_room_for_the_spares_beside_the_training_nodes_passes(allocated, spare_count, train_nodes):
    assert spares.allocation_problem(allocated, spare_count, train_nodes, "42") is None


def test_the_spare_forgotten_on_sbatch_nodes_names_the_nodes_to_ask_for():
    assert spares.allocation_problem(2, 1, 2, "42") == (
        "DDP_SPARE_NODES=1: job 42 has 2 node(s), too few for the 2 the job script trains on (DDP_TRAIN_NODES=2) "
        "plus 1 spare(s): submit with sbatch --nodes=3, or set DDP_TRAIN_NODES=1 to train on 1 node(s) with this "
        "allocation")


def test_a_1_node_script_with_a_spare_on_one_node_names_sbatch_nodes_2_and_no_smaller_training():
    line = spares.allocation_problem(1, 1, 1, "7")
    assert line.endswith("plus 1 spare(s): submit with sbatch --nodes=2") and "DDP_TRAIN_NODES=0" not in line


@pytest.mark.parametrize(("values", "message"), [
    (("2", "one", "2"), "DDP_SPARE_NODES=one is not a number of nodes: set it to 0 (no spares)"),
    (("2", "-1", "2"), "DDP_SPARE_NODES=-1 is not a number of nodes"),
    (("2", "1", "0"), "DDP_TRAIN_NODES=0 is not a number of nodes of at least 1: set it to the nodes the training "
                      "runs on (the job script's #SBATCH --nodes)"),
    (("2", "1", "two"), "DDP_TRAIN_NODES=two is not a number of nodes"),
    (("", "1", "2"), "SLURM_JOB_NUM_NODES= is not a number of nodes of at least 1"),
])
def test_a_malformed_setting_is_named_in_one_line(values, message):
    assert spares.check(*values).startswith(message)


def test_a_script_that_does_not_state_its_nodes_is_checked_only_for_a_node_left_to_train():
    assert spares.check("2", "1", "") is None
    assert spares.check("2", "2", "").startswith("DDP_SPARE_NODES=2 leaves no node to train on")


def test_the_cli_check_prints_one_line_and_exits_2_or_says_nothing(capsys):
    assert spares.main(["check", "2", "1", "2", "--job", "42"]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "submit with sbatch --nodes=3" in out
    assert spares.main(["check", "3", "1", "2"]) == 0
    assert capsys.readouterr().out == ""
