"""A full disk under the logs: the trainer's own lines fail to write, and the run still ends in one line.

Under ddp-launch a worker's stdout and stderr are files under <run-dir>/logs (torchrun's
--log-dir), so a disk that fills up can fail a print before it fails the next checkpoint.
/dev/full is the kernel's own full disk: every write(2) to it fails with ENOSPC (null(4)).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_train import console
from ddp_train.progress import ProgressBar
from train_helpers import TINY_ARGS, trainer_env

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")


@needs_dev_full
def test_a_line_that_cannot_be_written_is_kept_as_the_failure_and_nothing_more_is_written():
    with open("/dev/full", "w") as full:
        out = console.Console(enabled=True, stream=full)
        out.say("Epoch 3/12: 2.1 s")
        first = out.failed
        out.say("Epoch 4/12: 2.1 s")  # no second attempt, no second error

    assert first is not None and out.failed is first
    line = str(first)
    assert line.startswith("cannot write the output log /dev/full (ENOSPC: No space left on device; ")
    assert "MiB free in /dev" in line and console.KEPT in line


def test_lines_go_out_whole_and_in_order_with_what_the_stream_printed_itself(tmp_path):
    path = tmp_path / "rank0.log"
    with open(path, "w") as log:
        out = console.Console(enabled=True, stream=log)
        log.write("torch's own warning\n")  # buffered in the stream: must not come after ours
        out.say("header", "Epoch 1/2: 1.0 s")
        bar = ProgressBar(10, "Epoch 2/2", True, out, line_every_s=0.0)
        bar.update(5, 160)
        out.say("summary")

    lines = path.read_text().splitlines()
    assert lines[:3] == ["torch's own warning", "header", "Epoch 1/2: 1.0 s"]
    assert lines[3].startswith("Epoch 2/2: step 5/10 (50%)") and lines[4] == "summary"


def test_only_the_enabled_rank_writes(tmp_path):
    stream = io.StringIO()
    console.Console(enabled=False, stream=stream).say("from rank 1")
    assert stream.getvalue() == ""


def test_the_file_behind_stdout_is_named_by_its_path(tmp_path):
    path = tmp_path / "stdout"
    with open(path, "w") as f:
        assert console.output_path(f.fileno()) == path
    assert console.output_path(None) == Path("/dev/stdout")


@needs_dev_full
def test_a_warning_that_cannot_be_written_is_dropped_without_raising(monkeypatch):
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stderr", full)
        assert console.warn("ddp-train: warning: low space") is False


@needs_dev_full
def test_a_run_whose_stdout_is_a_full_disk_ends_with_one_error_line_and_exit_2(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "ddp_train", "--data-dir", str(data_dir), "--run-dir",
                               str(run_dir), *TINY_ARGS, "--epochs", "1"], stdout=full, stderr=subprocess.PIPE,
                              env=trainer_env(), text=True, timeout=300)

    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("ddp-train: error: cannot write the output log /dev/full (ENOSPC: "), lines
    assert "then run the same command again to resume" in lines[0]


# The fabric gate, alone on this machine (no torchrun: one rank, nothing to compare, a report all the same).
GATE = [sys.executable, "-m", "ddp_train.gate", "--device", "cpu", "--sizes", "4096", "--iters", "1"]


@needs_dev_full
def test_a_fabric_gate_whose_stdout_is_a_full_disk_ends_with_one_error_line_and_exit_2(tmp_path):
    run_dir = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = subprocess.run([*GATE, "--run-dir", str(run_dir)], stdout=full, stderr=subprocess.PIPE,
                              env=trainer_env(), text=True, timeout=120)

    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("fabric gate: error: cannot write the output log /dev/full (ENOSPC: "), lines
    assert "no training ran and no checkpoint changed" in lines[0]
    assert (run_dir / "gate.json").is_file()  # written before the report's print failed


def test_a_fabric_gate_report_with_a_file_in_the_run_dirs_place_is_one_line_and_exit_2(tmp_path):
    in_the_way = tmp_path / "run"
    in_the_way.write_text("a file, not a directory\n")
    done = subprocess.run([*GATE, "--run-dir", str(in_the_way)], capture_output=True, env=trainer_env(), text=True,
                          timeout=120)

    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"fabric gate: error: cannot write the fabric gate report {in_the_way}/gate.json ")
    assert "a file of that name is in the way of a directory: move it or pass another --run-dir" in lines[0]
    assert in_the_way.read_text() == "a file, not a directory\n"
