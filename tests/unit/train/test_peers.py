"""The roll call after a failed collective: which node is silent, and the one line naming it."""

from ddp_train.peers import lost_message, missing_nodes

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
