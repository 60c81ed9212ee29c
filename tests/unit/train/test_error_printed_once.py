"""An error of the trainer or the fabric gate is printed once for the whole job, by a rank that found it."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest

from ddp_train import exit_edge
from ddp_train.errors import Seen
from ddp_contract.errors import one_line
from ddp_train.exit_edge import QUIET_RANK_GRACE_S, prints_error, say_once
from train_helpers import trainer_env


@pytest.mark.parametrize("seen,rank,local_rank,prints", [
    (Seen.BY_EVERY_RANK, 0, 0, True),
    (Seen.BY_EVERY_RANK, 2, 0, False),  # the first rank of node 2 stays quiet about a flag
    (Seen.BY_EVERY_RANK, 3, 1, False),
    (Seen.BY_EVERY_RANK_OF_NODE, 2, 0, True),
    (Seen.BY_EVERY_RANK_OF_NODE, 3, 1, False),
    (Seen.BY_THIS_RANK, 3, 1, True),  # only this rank may know: it must say so
    (Seen.ELSEWHERE, 0, 0, False),
])
def test_who_prints_an_error(seen, rank, local_rank, prints):
    assert prints_error(seen, rank, local_rank) is prints


@pytest.mark.parametrize("prints,world_size,said,waited", [
    (True, "4", 1, []),
    (False, "4", 0, [QUIET_RANK_GRACE_S]),  # its exit must not end the printing rank before it speaks
    (False, "1", 0, []),  # a process of its own has no one to wait for
])
def test_the_printing_rank_says_it_and_quiet_ranks_of_a_job_wait(prints, world_size, said, waited, capsys,
                                                                  monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(exit_edge.time, "sleep", slept.append)
    say_once("ddp-train", prints, "node2 went away", {"WORLD_SIZE": world_size})
    assert capsys.readouterr().err.count("ddp-train: error: node2 went away\n") == said
    assert slept == waited


def test_an_error_message_stays_one_line():
    assert one_line("--run-dir /tmp/a\nb is a file") == "--run-dir /tmp/a\\nb is a file"
    # Every line break str.splitlines() knows, other control characters and a path's undecodable byte (as
    # os.fsdecode gives it) are escaped; printable text, non-ASCII included, is left as it is.
    breaks = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\t\x00\x1b"
    line = one_line(f"data{breaks}/caf\u00e9/\udcff end")
    assert len(line.splitlines()) == 1 and line.isprintable()
    assert line == "data\\r\\x0b\\x0c\\x1c\\x1d\\x1e\\x85\\u2028\\u2029\\t\\x00\\x1b/caf\u00e9/\\udcff end"


@pytest.mark.parametrize("env,size,several", [
    ({}, 1, False), ({"WORLD_SIZE": ""}, 1, False), ({"WORLD_SIZE": "1"}, 1, False),
    ({"WORLD_SIZE": "4"}, 4, True),
    ({"WORLD_SIZE": "abc"}, None, False),  # DistEnv names it; the process must live to say so
])
def test_world_size_is_read_once_for_every_exit(env, size, several):
    assert exit_edge.world_size(env) == size
    assert exit_edge.in_a_job_of_several(env) is several


def node2_first_rank(rank: str, local_rank: str) -> dict[str, str]:
    return trainer_env(RANK=rank, LOCAL_RANK=local_rank, WORLD_SIZE="4", LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")


@pytest.mark.parametrize("rank,local_rank,printed", [("0", "0", 1), ("2", "0", 0), ("3", "1", 0)])
def test_a_flag_error_is_printed_by_global_rank_0_alone(rank, local_rank, printed):
    # The first rank of every node used to print it too: once per node through ddp-launch.
    result = subprocess.run([sys.executable, "-m", "ddp_train", "--epochs", "0"],
                            env=node2_first_rank(rank, local_rank), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("ddp-train: error: --epochs 0 must be at least 1") == printed
    assert result.stderr.count("\n") == printed


def test_a_fabric_gate_error_is_printed_by_rank_0_while_the_quiet_rank_waits(tmp_path):
    # Both ranks find the same mistake (the launcher's port is no number) before any collective.
    ranks = [subprocess.Popen([sys.executable, "-m", "ddp_train.gate", "--run-dir", str(tmp_path), "--device", "cpu"],
                              env=trainer_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                                              LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="http"),
                              stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    started = time.monotonic()
    said = [rank.communicate(timeout=120)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2, 2]
    assert said == ["fabric gate: error: MASTER_PORT='http' is not an integer\n", ""]
    assert time.monotonic() - started >= QUIET_RANK_GRACE_S  # rank 1 left only after the grace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AGREE = textwrap.dedent("""
    import os, sys, torch
    from ddp_train import distributed
    from ddp_train.errors import TrainError
    rank = int(os.environ["RANK"])
    failing = {int(r) for r in sys.argv[1].split(",") if r}
    distributed.init_process_group(distributed.DistEnv.from_env(os.environ), torch.device("cpu"), 30, "gloo")
    try:
        distributed.agree_or_raise(TrainError(f"rank {rank} found it") if rank in failing else None,
                                   torch.device("cpu"))
        print("no error")
    except TrainError as exc:
        print(exc.seen.name, exc)
    sys.stdout.flush()
    distributed.destroy_process_group()
    os._exit(0)
""")


def agree(failing: str) -> list[str]:
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, failing], stdout=subprocess.PIPE, text=True,
                              env=trainer_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="3",
                                              LOCAL_WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
                                              MASTER_PORT=port))
             for rank in range(3)]
    return [p.communicate(timeout=120)[0].strip() for p in procs]


def test_an_error_only_rank_1_found_is_printed_by_rank_1_and_no_other():
    assert agree("1") == ["ELSEWHERE setup failed on rank 1 (its log says why)",
                          "BY_THIS_RANK rank 1 found it",
                          "ELSEWHERE setup failed on rank 1 (its log says why)"]


def test_an_error_several_ranks_found_is_printed_by_the_lowest_of_them():
    assert agree("2,1") == ["ELSEWHERE setup failed on rank 1 (its log says why)",
                            "BY_THIS_RANK rank 1 found it",
                            "ELSEWHERE setup failed on rank 1 (its log says why)"]


def test_no_error_anywhere_raises_nothing():
    assert agree("") == ["no error"] * 3
