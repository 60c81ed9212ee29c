"""ddp-bench report beside the figures: step time per rank, stragglers, what ran and what differed."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_bench.run_facts import differences, section


def manifest(nccl: str, debug: str, who: str = "user: set before ddp-launch ran") -> dict:
    return {"image": {"ids": {"APPTAINER_CONTAINER": "/img/t.sif"}, "labels": {}, "revision": "abc"},
            "torch": "2.14.1", "host_driver": None,
            "libraries": {"nccl": [{"path": "/l/libnccl.so.2", "version": nccl, "mount": "/",
                                    "mount_source": "/", "bound": False}]},
            "all_libraries_rank0": [], "environment": {"NCCL_DEBUG": {"value": debug, "set_by": who}},
            "nodes": {"n1": [0, 1]}, "rank_map": {"0": "n1", "1": "n1"}, "config": {"epochs": 3}}


def test_two_runs_are_told_apart_by_what_differed_and_nothing_else():
    diff = differences({"a": manifest("2.26.2", "WARN"), "b": manifest("2.28.3", "WARN")})
    assert diff == ["library nccl: a=2.26.2 /l/libnccl.so.2; b=2.28.3 /l/libnccl.so.2"]


def test_who_set_a_variable_is_part_of_what_differed():
    diff = differences({"a": manifest("2", "INFO"), "b": manifest("2", "INFO", "launcher: --nccl-debug")})
    assert diff == ["env NCCL_DEBUG: a=INFO (user); b=INFO (launcher)"]


def test_the_section_lists_each_ranks_step_time_names_the_straggler_and_shows_what_ran(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest("2.28.3", "WARN")))
    summary = {"step_times": [{"rank": 0, "node": "n1", "step_ms": 50.0, "compute_ms": 20.0, "wait_ms": 28.0},
                              {"rank": 1, "node": "n1", "step_ms": 50.0, "compute_ms": 48.0, "wait_ms": 1.0}],
               "stragglers": [{"who": "rank 1 on n1", "compute_ms": 48.0, "median_ms": 20.0, "over": 1.4}]}
    text = section([("run-a", Path(tmp_path), summary)])
    assert "| run-a | 1 | n1 | 50.0 | 48.0 | 1.0 |" in text
    assert "- run-a: straggler rank 1 on n1: 48.0 ms compute per step, 140% over the others' median 20.0 ms" in text
    assert "- Libraries (mapped, torch 2.14.1): nccl 2.28.3 /l/libnccl.so.2" in text
    assert "What differed" not in text  # one run: nothing to compare
