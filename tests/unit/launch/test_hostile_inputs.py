"""A hostile user's corpus: contradictory scheduler variables, huge hostlists, names no resolver
takes, misspelt subcommand flags. Each is refused before anything starts: exit 2, one line."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from ddp_launch import cli
from launch_envs import olivia, raven, runai, trainer_v2

LABEL_64 = "n" * 64                   # RFC 1035: labels are at most 63 octets
NAME_254 = ".".join(["a" * 50] * 5)   # 254 characters: names are at most 253
NOT_UTF8 = "node\udcff1"              # how os.environ shows the byte 0xff of a non-UTF-8 value


def without(env: dict, *names: str) -> dict:
    return {k: v for k, v in env.items() if k not in names}


CORPUS = {
    # -- SLURM: ranks and node ids that contradict the step's layout
    "procid at the task count": (raven(0, SLURM_PROCID="8"), ["--dry-run"],
                                 "SLURM_PROCID=8 but SLURM_STEP_NUM_TASKS=8"),
    "procid far past the task count": ({**olivia(0), "SLURM_PROCID": "7"}, ["--dry-run"],
                                       "SLURM_PROCID=7 but SLURM_STEP_NUM_TASKS=2"),
    "localid at the tasks on the node": (raven(1, SLURM_LOCALID="4"), ["--dry-run"],
                                         "SLURM_LOCALID=4 but SLURM_STEP_TASKS_PER_NODE='4(x2)' runs 4"),
    "nodeid disagrees with the node name": ({**olivia(0), "SLURM_NODEID": "1"}, ["--dry-run"],
                                            "SLURM_NODEID=1 but SLURMD_NODENAME='olivia-gh001' is node 0"),
    "node name not in the nodelist": ({**olivia(1), "SLURMD_NODENAME": "olivia-gh009"}, ["--dry-run"],
                                      "SLURMD_NODENAME='olivia-gh009' is not in SLURM_STEP_NODELIST"),
    "node name not in the nodelist, no node id": (
        without({**olivia(1), "SLURMD_NODENAME": "login1"}, "SLURM_NODEID"), ["--dry-run"],
        "SLURMD_NODENAME='login1' is not in SLURM_STEP_NODELIST"),
    # -- SLURM: hostlists refused from their size, before expansion
    "hostlist of 10^8 hosts": ({**olivia(0), "SLURM_STEP_NODELIST": "n[1-10000]x[1-10000]"}, ["--dry-run"],
                               "names 100000000 hosts, more than SLURM's limit of 65536"),
    "hostlist one over the limit": ({**olivia(0), "SLURM_STEP_NODELIST": "n[1-65536],m"}, ["--dry-run"],
                                    "names 65537 hosts"),
    "hostlist of 10^30 hosts": ({**olivia(0), "SLURM_STEP_NODELIST": "n[0-" + "9" * 30 + "]"}, ["--dry-run"],
                                "more than SLURM's limit"),
    # -- host names that no resolver takes
    "head label over 63": ({**olivia(1), "SLURM_STEP_NODELIST": f"{LABEL_64},olivia-gh002"}, ["--dry-run"],
                           "is not a valid host name (its label nnnnnnnnnnnnnnnnnnnn... has 64 characters"),
    "head name over 253": ({**olivia(1), "SLURM_STEP_NODELIST": f"{NAME_254},olivia-gh002"}, ["--dry-run"],
                           "over 253 characters"),
    "head name not UTF-8": ({**olivia(1), "SLURM_STEP_NODELIST": f"{NOT_UTF8},olivia-gh002"}, ["--dry-run"],
                            "holds bytes that are not UTF-8"),
    "head name with an empty label": ({**olivia(1), "SLURM_STEP_NODELIST": "a..b,olivia-gh002"}, ["--dry-run"],
                                      "has an empty label"),
    "--rdzv-host label over 63": (olivia(1), ["--dry-run", "--rdzv-host", f"{LABEL_64}.example"],
                                  f"--rdzv-host='{LABEL_64}.example' is not a valid host name"),
    "--rdzv-host with a space": (olivia(1), ["--dry-run", "--rdzv-host", "head node"],
                                 "spaces or control characters"),
    "DDP_LAUNCH_RDZV_HOST not UTF-8": ({**olivia(1), "DDP_LAUNCH_RDZV_HOST": NOT_UTF8}, ["--dry-run"],
                                       "DDP_LAUNCH_RDZV_HOST='node\\udcff1' is not a valid host name"),
    "MASTER_ADDR label over 63": ({**runai(1), "MASTER_ADDR": LABEL_64}, ["--dry-run"],
                                  "MASTER_ADDR='nnnn"),
    "PET_MASTER_ADDR not UTF-8": ({**trainer_v2(1), "PET_MASTER_ADDR": NOT_UTF8}, ["--dry-run"],
                                  "PET_MASTER_ADDR='node\\udcff1' is not a valid host name"),
    "kubeflow --rdzv-host over 253": (trainer_v2(1), ["--dry-run", "--rdzv-host", NAME_254],
                                      "--rdzv-host="),
    # -- Kubeflow / RunAI: pod ranks and node counts that contradict each other
    "PET_NODE_RANK at PET_NNODES": ({**trainer_v2(0), "PET_NODE_RANK": "2"}, ["--dry-run"],
                                    "PET_NODE_RANK=2 but PET_NNODES=2"),
    "RunAI RANK past PET_NNODES": ({**runai(0), "RANK": "5"}, ["--dry-run"], "RANK=5 but PET_NNODES=2"),
    "PET_NNODES min over max": ({**trainer_v2(0), "PET_NNODES": "4:2"}, ["--dry-run"],
                                "PET_NNODES='4:2' asks for at least 4 but at most 2 nodes"),
    "master address missing": (without(trainer_v2(1), "PET_MASTER_ADDR"), ["--dry-run"],
                               "master address is missing; pass --rdzv-host"),
    # -- subcommands: a misspelt flag is one line, not argparse's usage dump
    "binds misspelt flag": ({}, ["binds", "--sit", "olivia"],
                            "binds: unrecognized arguments: --sit olivia (see ddp-launch binds --help)"),
    "binds abbreviated flag": ({}, ["binds", "--no-exist"], "binds: unrecognized arguments: --no-exist"),
    "binds flag without its value": ({}, ["binds", "--site"], "binds: argument --site: expected one argument"),
    "doctor misspelt flag": ({}, ["doctor", "--offlin"], "doctor: unrecognized arguments: --offlin"),
    "doctor stray argument": ({}, ["doctor", "--json", "now"], "doctor: unrecognized arguments: now"),
    # -- the launcher's own flags
    "launcher flag abbreviated": ({}, ["--dry", "--mode", "local"], "unrecognized arguments: --dry"),
    "launcher flag without its value": ({}, ["--mode"], "argument --mode: expected one argument"),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_hostile_input_is_refused_in_one_line_with_exit_2(case, capsys):
    env, argv, fragment = CORPUS[case]
    with mock.patch.dict(os.environ, env, clear=True):
        code = cli.main(argv)
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert err.startswith("ddp-launch: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert fragment in err


def test_a_missing_master_address_is_fixed_by_the_rdzv_host_the_error_recommends(capsys):
    # The error above says "pass --rdzv-host"; doing so must then plan the launch.
    with mock.patch.dict(os.environ, without(trainer_v2(1), "PET_MASTER_ADDR"), clear=True):
        code = cli.main(["--dry-run", "--rdzv-host", "10.96.0.20"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "--rdzv-endpoint=10.96.0.20:29400" in out
