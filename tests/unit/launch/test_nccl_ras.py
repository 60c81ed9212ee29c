"""NCCL's RAS, asked once when a rank hangs: the protocol against a stand-in that answers as NCCL 2.24 to
2.30 do (tests/stand_ins/nccl_ras.py, written from NVIDIA/nccl src/ras/client_support.cc), and the
reports NCCL users published (data/nccl-ras/README.md) read into a verdict."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from stand_ins import nccl_ras as stand_in

from ddp_launch import nccl_ras, nccl_ras_report

DATA = Path(__file__).parent / "data" / "nccl-ras"


def job(version: str, *, missing: bool = True, behind: bool = True) -> dict:
    """Two nodes, four ranks (10.0.0.1: ranks 0-1, 10.0.0.2: ranks 2-3); rank 2 one all-reduce behind,
    rank 3 unresponsive."""
    ranks = [{"rank": r, "host": f"10.0.0.{1 + r // 2}", "pid": 4000 + r, "gpu": r % 2,
              "counts": {"AllReduce": 6649 if (behind and r == 2) else 6650, "Broadcast": 3}} for r in range(4)]
    absent = [dict(ranks.pop())] if missing else []
    return {"nccl_version": version, "communicators": [{"hash": "0x27a079b828ff1a75", "size": 4, "ranks": ranks,
                                                         "missing": absent}]}


@pytest.fixture
def ras():
    servers = []

    def start(described: dict) -> stand_in.Server:
        server = stand_in.serve(described)
        servers.append(server)
        return server
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def env_for(server) -> dict:
    return {"NCCL_RAS_ADDR": f"127.0.0.1:{server.server_address[1]}"}


@pytest.mark.parametrize("version, form", [("2.24.3", "text"), ("2.26.2", "text"), ("2.28.3", "text"),
                                           ("2.28.7", "json"), ("2.28.9", "json"), ("2.29.2", "json")])
def test_json_is_asked_for_and_text_taken_where_the_nccl_is_older_than_2_28_7(ras, version, form):
    server = ras(job(version))
    answer = nccl_ras.query("127.0.0.1", server.server_address[1], 5)
    assert answer.format == form
    # ncclras's handshake (src/ras/client.cc): protocol, timeout, format, then the query.
    assert server.log == ["CLIENT PROTOCOL 2", f"TIMEOUT {nccl_ras.LEG_TIMEOUT_S}", "SET FORMAT json", "STATUS"]


@pytest.mark.parametrize("version", ["2.24.3", "2.26.2", "2.28.7", "2.28.9", "2.29.2", "2.30.7"])
def test_every_version_names_the_missing_rank_and_the_one_behind_with_their_node(ras, version):
    server = ras(job(version))
    answer = nccl_ras.query("127.0.0.1", server.server_address[1], 5)
    verdict = nccl_ras_report.read(answer.format, answer.text)
    assert [m.rank for m in verdict.missing] == [3]
    assert not verdict.healthy and "10.0.0.2" in verdict.hosts()
    [gap] = verdict.gaps
    # Per operation since 2.26 (ras.rst: "starting with NCCL 2.26, this is broken down per collective
    # operation type"); before, one count of every collective (the 3 broadcasts too).
    before_2_26 = version < "2.26"
    low, high = (6652, 6653) if before_2_26 else (6649, 6650)
    assert ([r.rank for r in gap.behind], gap.behind_count, gap.ahead_count) == ([2], low, high)
    assert gap.operation == ("collective" if before_2_26 else "AllReduce")
    line = nccl_ras.verdict_line(verdict, [2], {"10.0.0.2": "node2"})
    assert "rank(s) 3 missing" in line and f"rank(s) 2 at {low}, others up to {high}" in line, line
    assert line.endswith("node(s): node2"), line


def test_the_missing_comma_of_nccl_2_28_7_to_2_28_9_is_mended(ras):
    # jsonWriteMissingRank printed "nvml_dev" without the comma before "status" until 2.29: the JSON is
    # malformed exactly when a rank is missing.
    text = stand_in.render_json(job("2.28.9"))
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    verdict = nccl_ras_report.read_json(text)
    assert [(m.rank, m.host, m.pid) for m in verdict.missing] == [(3, "10.0.0.2", 4003)]


def test_a_ras_that_says_ok_while_ranks_hang_is_said_to_say_ok_and_the_watchdog_stands(ras):
    # NVIDIA/nccl#1730: every rank present, counts equal, and PyTorch's collective timed out.
    server = ras(job("2.29.2", missing=False, behind=False))
    answer = nccl_ras.query("127.0.0.1", server.server_address[1], 5)
    verdict = nccl_ras_report.read(answer.format, answer.text)
    assert verdict.healthy
    line = nccl_ras.verdict_line(verdict, [3])
    assert "every rank present and every collective count equal while rank(s) 3 stopped advancing" in line
    assert "NVIDIA/nccl#1730" in line and "the watchdog's verdict stands" in line


def test_the_ok_report_of_issue_1730_reads_as_healthy():
    verdict = nccl_ras_report.read("text", (DATA / "issue-1730-nccl-2.26.2-ok-during-a-timeout.txt").read_text())
    assert (verdict.nccl_version, verdict.communicators, verdict.healthy) == ("2.26.2", 1, True)


def test_counts_apart_where_nccl_names_only_the_ranks_ahead_say_so():
    # NVIDIA/nccl#1911: 30 ranks at 640 (not named: no outliers), ranks 12 and 13 at 641.
    verdict = nccl_ras_report.read("text", (DATA / "issue-1911-nccl-2.26.2-allgather-counts-apart.txt").read_text())
    [gap] = verdict.gaps
    assert (gap.operation, gap.behind, [r.rank for r in gap.ahead]) == ("AllGather", (), [12, 13])
    line = nccl_ras.verdict_line(verdict, [])
    assert "rank(s) 12-13 ahead at 641, the others (not named by NCCL) at 640" in line, line


def test_the_user_guides_stopped_process_names_its_rank_and_node():
    verdict = nccl_ras_report.read("text", (DATA / "ras-rst-incomplete-a-stopped-process.txt").read_text())
    assert [m.rank for m in verdict.missing] == [21]
    assert [(p.host, p.pid, p.dead) for p in verdict.processes] == [("172.16.64.213", 3487984, False)]
    line = nccl_ras.verdict_line(verdict, [21])
    assert "rank(s) 21 missing; process 3487984 on 172.16.64.213 sent no data" in line, line


def test_the_user_guides_json_names_the_unresponsive_rank():
    verdict = nccl_ras_report.read("json", (DATA / "ras-rst-nccl-2.29.1-json-a-missing-rank.json").read_text())
    assert [(m.rank, m.host, m.pid, m.dead) for m in verdict.missing] == [(1, "172.16.64.245", 1524345, False)]
    assert verdict.pids == {1524344, 1524345}


def test_a_dead_process_is_said_to_be_dead():
    described = job("2.29.2")
    described["communicators"][0]["missing"][0]["dead"] = True
    for text, form in ((stand_in.render_json(described), "json"), (stand_in.render_text(described), "text")):
        verdict = nccl_ras_report.read(form, text)
        assert [(m.rank, m.dead) for m in verdict.missing] == [(3, True)], form
        assert "rank(s) 3 dead (process 4003 on 10.0.0.2)" in nccl_ras.verdict_line(verdict, [3])


def test_consult_keeps_the_report_beside_the_stacks_and_says_the_verdict(ras, tmp_path):
    server = ras(job("2.29.2"))
    said = nccl_ras.consult(env_for(server), str(tmp_path), "node2", [4002, 4003], [3], 5)
    assert said.saved == str(tmp_path / "nccl-ras-node2.json")
    assert json.loads(Path(said.saved).read_text().replace('"nvml_dev": 1\n', '"nvml_dev": 1,\n'))
    assert said.line.startswith("NCCL RAS (NCCL 2.29.2, 1 communicator(s)): rank(s) 3 missing")
    assert said.line.endswith(f"; its report: {tmp_path}/nccl-ras-node2.json")


def test_ras_turned_off_is_one_line_and_nothing_is_asked(ras, tmp_path):
    server = ras(job("2.29.2"))
    said = nccl_ras.consult({**env_for(server), "NCCL_RAS_ENABLE": "0"}, str(tmp_path), "n", [1], [0], 5)
    assert said.line == "NCCL RAS is off (NCCL_RAS_ENABLE=0): no verdict from NCCL"
    assert server.log == [] and not list(tmp_path.iterdir())


def test_nothing_listening_is_one_line_that_says_what_that_can_mean(tmp_path):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    started = time.monotonic()
    said = nccl_ras.consult({"NCCL_RAS_ADDR": f"127.0.0.1:{port}"}, str(tmp_path), "n", [1], [0], 30)
    assert time.monotonic() - started < 10  # refused at once: not the 30 s budget
    assert said.line == (f"NCCL RAS: nothing listens on 127.0.0.1:{port} (NCCL older than 2.24, NCCL_RAS_ENABLE=0, "
                         "another NCCL_RAS_ADDR, or no NCCL in these workers): no verdict from NCCL")


def test_another_jobs_ras_on_a_shared_node_is_not_taken_for_ours(ras, tmp_path):
    # NCCL's environment docs: jobs sharing a node should each set their own NCCL_RAS_ADDR; where they do
    # not, the port answers for whichever job bound it first.
    server = ras(job("2.29.2"))
    said = nccl_ras.consult(env_for(server), str(tmp_path), "node2", [777, 778], [3], 5)
    assert "answered for another job (none of the processes it names is a worker of node2): ignored" in said.line


def test_a_text_report_naming_only_another_nodes_ranks_is_still_this_jobs(ras, tmp_path):
    # The text names only outliers: here rank 3's process on the other node, none of node1's workers.
    server = ras(job("2.27.7"))
    said = nccl_ras.consult(env_for(server), str(tmp_path), "node1", [4000, 4001], [], 5)
    assert said.line.startswith("NCCL RAS (NCCL 2.27.7, 1 communicator(s); a text report: JSON needs NCCL 2.28.7): "
                                "rank(s) 3 missing (process 4003 on 10.0.0.2)"), said.line


def test_something_else_on_the_port_is_not_read_as_a_report(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def http() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        threading.Thread(target=http, daemon=True).start()
        said = nccl_ras.consult({"NCCL_RAS_ADDR": f"127.0.0.1:{listener.getsockname()[1]}"}, str(tmp_path), "n",
                                [1], [0], 5)
    assert "answered 'HTTP/1.1 400 Bad Request', not NCCL RAS's 'SERVER PROTOCOL'" in said.line


def test_a_report_that_never_ends_is_given_up_on_within_the_budget(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def stuck() -> None:
            conn, _ = listener.accept()
            for _ in range(3):
                conn.recv(100)
                conn.sendall(b"SERVER PROTOCOL 2\n" if _ == 0 else b"OK\n")
            conn.recv(100)
            time.sleep(60)  # STATUS, and nothing more
            conn.close()
        threading.Thread(target=stuck, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(nccl_ras.Unanswered, match="did not finish its report within 2 s"):
            nccl_ras.query("127.0.0.1", listener.getsockname()[1], 2)
    assert time.monotonic() - started < 20  # the budget, give or take a loaded machine: not the 60 s


@pytest.mark.parametrize("value, expected", [("", ("localhost", 28028)), ("localhost:12345", ("localhost", 12345)),
                                             ("10.1.2.3:28028", ("10.1.2.3", 28028)), ("[::1]:28029", ("::1", 28029))])
def test_the_address_is_read_as_nccl_reads_nccl_ras_addr(value, expected):
    assert nccl_ras.address({"NCCL_RAS_ADDR": value} if value else {}) == expected


def test_an_address_without_a_port_is_said_in_one_line(tmp_path):
    said = nccl_ras.consult({"NCCL_RAS_ADDR": "localhost"}, str(tmp_path), "n", [1], [0], 5)
    assert said.line == "NCCL RAS not asked: NCCL_RAS_ADDR='localhost' is not host:port or [ipv6]:port"


def test_rank_lists_are_spans():
    assert nccl_ras.span([5, 1, 2, 3, 7, 8]) == "1-3,5,7-8"
