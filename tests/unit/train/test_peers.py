"""The roll call after a failed collective: which node is silent, and the one line naming it."""

import json
import time

from ddp_contract import ROLL_CALL_REPORT
from ddp_train.safety import peers
from ddp_contract.roll_call import head_lost_message
from ddp_train.safety.peers import lost_message, missing_nodes, roll_call

HOSTS = ["node1", "node1", "node2", "node2"]


def test_the_silent_ranks_name_their_node():
    assert missing_nodes(HOSTS, answered=[0, 1]) == {"node2": [2, 3]}


def test_one_silent_rank_names_its_node_too():
    assert missing_nodes(HOSTS, answered=[0, 1, 3]) == {"node2": [2]}


def test_every_rank_answering_is_no_lost_node():
    assert missing_nodes(HOSTS, answered=[0, 1, 2, 3]) == {}


def test_the_line_names_the_node_its_ranks_the_cause_and_the_checkpoint_kept():
    line = lost_message({"node2": [2, 3]}, HOSTS, 15, "Connection closed by peer [10.0.0.12]:4242",
                        "/r/checkpoint.pt")
    assert line.startswith("lost contact with node2 (ranks 2, 3): no answer 15 s after a collective failed "
                           "(Connection closed by peer [10.0.0.12]:4242)")
    assert "The last checkpoint (/r/checkpoint.pt) is kept" in line
    assert "\n" not in line


def test_a_line_before_the_first_checkpoint_promises_none_and_says_the_job_starts_again():
    # A node lost at the fabric gate or in the first epoch: nothing to resume from (the trainer passes "").
    line = lost_message({"node2": [2, 3]}, HOSTS, 15, "timed out", "")
    assert line.endswith("the node dropped off the network or died. No checkpoint was written yet: resubmit or "
                         "requeue the job to start it again, on other nodes if a node stays down"), line
    assert "is kept" not in line and "resume" not in line
    head = head_lost_message("node1", "Connection reset by peer", "")
    assert head.endswith("(Connection reset by peer); no checkpoint was written yet: resubmit or requeue the job "
                         "to start it again"), head


def test_a_silent_rank_where_every_node_answered_is_a_dead_rank_not_a_lost_node():
    line = lost_message({"node2": [2]}, HOSTS, 15, "Connection reset by peer", "/r/checkpoint.pt")
    assert line.startswith("rank 2 on node2 stopped answering while every node is up (killed or crashed: see "
                           "that rank's log) after a collective failed (Connection reset by peer). The last")
    assert "lost contact" not in line


def test_a_lost_node_is_named_alone_not_the_ranks_blocked_behind_it():
    # Rank 0 may still be blocked in a collective behind rank 1, which is in the roll call.
    line = lost_message({"node1": [0], "node2": [2, 3]}, HOSTS, 15, "timed out", "/r/checkpoint.pt")
    assert line.startswith("lost contact with node2 (ranks 2, 3): no answer 15 s after a collective failed")
    assert "node1" not in line


# roll_call against a real c10d store (torch.distributed.HashStore: the same set/check/add/get
# as the TCPStore torchrun's agent hosts), ranks 0-1 on node1 and 2-3 on node2.

def _store():
    import torch.distributed as dist
    return dist.HashStore()


def test_a_roll_call_names_the_node_none_of_whose_ranks_answered():
    store = _store()
    store.set("ddp-train/roll-call/0", "1")  # rank 0 answered; node2's ranks never do
    lost = roll_call(HOSTS, 1, RuntimeError("Connection closed by peer"), "/r/checkpoint.pt", "node1",
                     store=store, wait_s=0.2)
    assert lost is not None and lost.prints
    assert str(lost).startswith("lost contact with node2 (ranks 2, 3): no answer")


def test_a_rank_failing_after_the_verdict_takes_it_at_once_and_stays_quiet():
    # gloo's ring: rank 0 waits on rank 1, which only fails rank 0 by exiting after its roll call.
    store = _store()
    store.set("ddp-train/roll-call/0", "1")
    first = roll_call(HOSTS, 1, RuntimeError("Connection closed by peer"), "/r/checkpoint.pt", "node1",
                      store=store, wait_s=0.2)
    started = time.monotonic()
    late = roll_call(HOSTS, 0, RuntimeError("Connection reset by peer"), "/r/checkpoint.pt", "node1",
                     store=store, wait_s=5)
    assert time.monotonic() - started < 1.0  # not a second roll call of 5 s
    assert late is not None and not late.prints
    assert str(late) == str(first)


def test_every_rank_answering_the_roll_call_keeps_the_original_error():
    store = _store()
    for rank in (0, 2, 3):
        store.set(f"ddp-train/roll-call/{rank}", "1")
    assert roll_call(HOSTS, 1, RuntimeError("boom"), "/r/checkpoint.pt", "node1", store=store, wait_s=5) is None


def test_a_store_that_does_not_answer_names_the_head_node_from_one_rank_per_node():
    class Gone:
        def set_timeout(self, _):
            raise RuntimeError("Connection refused")

    quiet = roll_call(HOSTS, 3, RuntimeError("timed out"), "/r/checkpoint.pt", "node1", store=Gone(), wait_s=0.2)
    loud = roll_call(HOSTS, 2, RuntimeError("timed out"), "/r/checkpoint.pt", "node1", store=Gone(), wait_s=0.2)
    assert str(loud).startswith("lost contact with the head node node1")
    assert loud.prints and not quiet.prints


# The report the job script reads (<run-dir>/roll-call.json): only for a node that is gone.

def test_a_lost_node_comes_with_a_report_of_its_ranks_and_the_times_of_failure_and_verdict():
    store = _store()
    store.set("ddp-train/roll-call/0", "1")
    before = time.time()
    lost = roll_call(HOSTS, 1, RuntimeError("Connection closed by peer"), "/r/checkpoint.pt", "node1",
                     store=store, wait_s=0.2)
    report = lost.report
    assert report["lost"] == [{"node": "node2", "ranks": [2, 3]}]
    assert report["cause"] == "Connection closed by peer" and report["message"] == str(lost)
    assert before - 0.01 <= report["failed_at"] <= report["named_at"] - 0.15  # the roll call waited 0.2 s


def test_ranks_that_died_on_a_live_node_make_no_report():
    store = _store()
    for rank in (0, 3):
        store.set(f"ddp-train/roll-call/{rank}", "1")
    lost = roll_call(HOSTS, 1, RuntimeError("Connection reset by peer"), "/r/checkpoint.pt", "node1",
                     store=store, wait_s=0.2)
    assert lost is not None and "stopped answering while every node is up" in str(lost)
    assert lost.report is None


def test_a_lost_head_is_reported_by_its_node_name_when_master_addr_is_its_address(monkeypatch):
    class Gone:
        def set_timeout(self, _):
            raise RuntimeError("Connection refused")

    addresses = {"node1": "10.0.0.11", "node2": "10.0.0.12"}
    monkeypatch.setattr(peers.socket, "gethostbyname", lambda host: addresses[host])
    lost = roll_call(HOSTS, 2, RuntimeError("timed out"), "/r/checkpoint.pt", "10.0.0.11", store=Gone(), wait_s=0.2)
    assert lost.report["lost"] == [{"node": "node1", "ranks": [0, 1]}]
    assert str(lost).startswith("lost contact with the head node 10.0.0.11")


def test_the_report_is_written_whole_under_its_contract_name(tmp_path):
    peers.write_report(tmp_path, {"lost": [{"node": "node2", "ranks": [2]}]})
    assert json.loads((tmp_path / ROLL_CALL_REPORT).read_text())["lost"][0]["node"] == "node2"
    assert [p.name for p in tmp_path.iterdir()] == [ROLL_CALL_REPORT]  # no temporary file left


def test_a_report_that_cannot_be_written_is_a_warning_not_a_second_error(tmp_path, capsys):
    peers.write_report(tmp_path / "absent", {"lost": []})
    assert "ddp-train: warning: cannot write" in capsys.readouterr().out


def test_ranks_are_named_as_slurm_names_their_node():
    assert peers.node_name({"SLURMD_NODENAME": "node7"}) == "node7"
    assert peers.node_name({}) == peers.socket.gethostname()


def test_ranks_are_named_as_the_launcher_names_their_node_first():
    # ddp-launch exports DDP_NODE_NAME from the scheduler's variables (a pod's name, SLURMD_NODENAME).
    assert peers.node_name({"DDP_NODE_NAME": "ddp-train-worker-0", "SLURMD_NODENAME": "node7"}) == "ddp-train-worker-0"


# A node whose launcher stopped the step with its own line (ddp_contract.launcher_reports: its rank 0's
# usage error): its silence, and its store's, are that error, not a lost node.

USAGE = "ddp-train: error: --run-dir runs/x is in use by job 7 on node1: pick another --run-dir"


def test_a_head_whose_launcher_stopped_on_a_usage_error_is_named_with_its_line_not_as_lost(tmp_path):
    from ddp_contract import launcher_reports

    class Gone:  # the head's agent exited: its store with it
        def set_timeout(self, _):
            raise RuntimeError("Connection refused")

    launcher_reports.write(str(tmp_path), "node1", 2, USAGE, now=time.time())
    lost = roll_call(HOSTS, 2, RuntimeError("Connection closed by peer"), "/r/checkpoint.pt", "node1", store=Gone(),
                     wait_s=0.2, run_dir=str(tmp_path), env={})
    assert str(lost).startswith(f"node1's ddp-launch stopped first (exit 2): {USAGE}; this rank's collective "
                                "failed with it (Connection closed by peer)"), str(lost)
    assert lost.prints and lost.report is None  # no roll-call.json: nothing for the quarantine


def test_a_silent_node_whose_launcher_stopped_on_its_own_error_makes_no_lost_node_report(tmp_path):
    from ddp_contract import launcher_reports

    store = _store()
    store.set("ddp-train/roll-call/3", "1")  # node2 answers; node1's ranks stopped with their launcher
    launcher_reports.write(str(tmp_path), "node1", 2, USAGE, now=time.time())
    lost = roll_call(HOSTS, 2, RuntimeError("Connection closed by peer"), "/r/checkpoint.pt", "node1", store=store,
                     wait_s=0.2, run_dir=str(tmp_path), env={})
    assert str(lost).startswith(f"node1's ddp-launch stopped first (exit 2): {USAGE}")
    assert lost.report is None


def test_a_report_from_an_earlier_step_is_not_taken_for_this_ones(tmp_path):
    from ddp_contract import launcher_reports

    class Gone:
        def set_timeout(self, _):
            raise RuntimeError("Connection refused")

    launcher_reports.write(str(tmp_path), "node1", 2, USAGE, now=time.time() - 3600)
    lost = roll_call(HOSTS, 2, RuntimeError("timed out"), "/r/checkpoint.pt", "node1", store=Gone(), wait_s=0.2,
                     run_dir=str(tmp_path), env={"DDP_RENDEZVOUS_STARTED_AT": str(time.time() - 5)})
    assert str(lost).startswith("lost contact with the head node node1")
