"""No run is ever destroyed, and a run dir that cannot take a checkpoint is found before training."""

from __future__ import annotations

import datetime
import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_train import checkpoint, cli, write_failure
from ddp_train.recipe import learner
from ddp_train.safety import rundir
from ddp_train.errors import TrainError

TINY = ["--allow-unverified-data", "--batch-size", "32", "--epochs", "1", "--width-scale", "0.0625",
        "--device", "cpu", "--no-tta"]
NOON = datetime.datetime(2026, 11, 23, 12, 0, 5, tzinfo=datetime.timezone.utc)


@pytest.fixture(autouse=True)
def _world_of_one(world_of_one):
    """In-process runs: a world of one (conftest.world_of_one)."""


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_no_resume_keeps_the_finished_run_aside_and_trains_fresh(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    # Two epochs, a checkpoint after each: checkpoint.pt and checkpoint.prev.pt.
    assert cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY, "--epochs", "2",
                     "--checkpoint-every", "1"]) == 0
    earlier = contents(run_dir)
    assert {"checkpoint.pt", "checkpoint.prev.pt", "metrics.jsonl"} <= set(earlier)
    capsys.readouterr()

    assert cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY, "--no-resume"]) == 0

    out = capsys.readouterr().out
    kept = [p for p in run_dir.iterdir() if p.name.startswith("checkpoint-")]
    assert len(kept) == 1 and kept[0].is_dir()
    assert contents(kept[0]) == {name: earlier[name] for name in rundir.PREVIOUS_RUN_FILES}
    assert f"kept in {kept[0]}/" in out and "Epoch 1/1" in out  # said where, then trained anew
    assert (run_dir / "checkpoint.pt").read_bytes() != earlier["checkpoint.pt"]
    assert not (run_dir / "checkpoint.prev.pt").exists()  # the fresh run has had one save only
    fresh_metrics = (run_dir / "metrics.jsonl").read_text()
    assert fresh_metrics.count('"type": "run"') == 1  # not appended to the earlier run's records


def test_the_mismatch_error_still_recommends_no_resume_and_says_it_keeps_the_run(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY]) == 0
    capsys.readouterr()
    assert cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY, "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "--seed 0, this run has 1" in err and "--no-resume (which keeps this run" in err


def test_nothing_to_move_aside_is_no_directory(tmp_path):
    assert rundir.move_previous_run(tmp_path, NOON) is None
    assert list(tmp_path.iterdir()) == []


def test_two_fresh_starts_in_one_second_get_their_own_directories(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("first\n")
    first = rundir.move_previous_run(tmp_path, NOON)
    (tmp_path / "metrics.jsonl").write_text("second\n")
    (tmp_path / "checkpoint.prev.pt").write_text("older\n")
    second = rundir.move_previous_run(tmp_path, NOON)
    assert first is not None and first.name == "checkpoint-20261123T120005Z"
    assert second is not None and second.name == "checkpoint-20261123T120005Z-1"
    assert contents(first) == {"metrics.jsonl": b"first\n"}
    assert contents(second) == {"metrics.jsonl": b"second\n", "checkpoint.prev.pt": b"older\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, second.name]


def test_the_time_in_the_name_is_utc(tmp_path):
    oslo = datetime.timezone(datetime.timedelta(hours=1))
    assert rundir.aside_name(NOON.astimezone(oslo)) == "checkpoint-20261123T120005Z"


@pytest.mark.parametrize("code,words", [
    (errno.ENOSPC, "is full"),
    (errno.EDQUOT, "over its disk quota"),
    (errno.EROFS, "read-only file system"),
    (errno.EACCES, "not writable"),
])
def test_a_full_or_unwritable_run_dir_is_found_by_the_probe(code, words, tmp_path, monkeypatch):
    # A full disk or quota, a read-only mount and missing permissions cannot be made here as
    # root in a container, so the fsync that reports them is made to fail the way it would.
    def fails(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(rundir.os, "fsync", fails)
    with pytest.raises(TrainError) as raised:
        rundir.check_writable(tmp_path / "run")
    message = str(raised.value)
    assert words in message and f"--run-dir {tmp_path / 'run'}" in message and "another --run-dir" in message
    assert list((tmp_path / "run").iterdir()) == []  # the probe file is gone again


def test_the_probe_leaves_a_writable_run_dir_empty(tmp_path):
    rundir.check_writable(tmp_path / "new" / "run")
    assert list((tmp_path / "new" / "run").iterdir()) == []


def test_a_full_run_dir_stops_the_trainer_before_it_reads_the_data(tmp_path, capsys, monkeypatch):
    def fails(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rundir.os, "fsync", fails)
    code = cli.main(["--data-dir", str(tmp_path / "no-data-here"), "--run-dir", str(tmp_path / "run"), *TINY])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is full (No space left on device)" in err


def test_low_space_is_a_warning_under_twice_a_checkpoint(tmp_path):
    assert rundir.low_space_warning(tmp_path, free=2 * 2**20, checkpoint_bytes=2**20) is None
    warning = rundir.low_space_warning(tmp_path, free=2**20, checkpoint_bytes=2**20)
    assert warning is not None and "\n" not in warning
    assert "1.0 MiB free, under twice a checkpoint (1.0 MiB)" in warning and str(tmp_path) in warning


def test_the_trainer_warns_about_low_space_before_the_first_epoch(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rundir, "free_bytes", lambda run_dir: 1000)
    assert cli.main(["--data-dir", str(data_dir), "--run-dir", str(tmp_path / "run"), *TINY]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "under twice a checkpoint" in line]
    assert len(warnings) == 1 and warnings[0].startswith("ddp-train: warning: ")


def test_the_estimate_counts_weights_momentum_and_ema(tmp_path):
    import torch
    model = torch.nn.Linear(10, 10)  # 110 float32 parameters
    assert learner.estimated_bytes(model, copies=2) == 2 * 110 * 4


def test_a_disk_that_fills_up_mid_run_is_one_line_and_keeps_the_last_checkpoint(data_dir, tmp_path, capsys,
                                                                                monkeypatch):
    run_dir = tmp_path / "run"
    real_save, saved = checkpoint.save_atomic, []

    def second_save_hits_a_full_disk(state, path):
        if saved:  # the real writer starts its temporary file, then fails as a full disk does
            def failing_torch_save(obj, handle):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            monkeypatch.setattr(checkpoint.torch, "save", failing_torch_save)
        real_save(state, path)
        saved.append(path.read_bytes())

    monkeypatch.setattr(checkpoint, "save_atomic", second_save_hits_a_full_disk)

    code = cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY, "--epochs", "2",
                     "--checkpoint-every", "1"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "No space left on device" in err and "run the same command again to resume" in err
    assert len(saved) == 1 and (run_dir / "checkpoint.pt").read_bytes() == saved[0]  # epoch 1's, intact
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]  # no half-written file left


def test_a_checkpoint_over_the_file_size_limit_is_one_line_naming_the_limit_and_keeps_the_last(data_dir, tmp_path):
    # Under `ulimit -f` a write past the limit fails with EFBIG (setrlimit(2), RLIMIT_FSIZE;
    # Python ignores the SIGXFSZ that comes with it), and torch.save's zip writer turns that
    # into RuntimeError "[enforce fail at inline_container.cc] unexpected pos": the real one here.
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "ddp_train", "--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY,
            "--epochs", "2", "--checkpoint-every", "1"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    # Back to epoch 1's checkpoint (the recovery hint's `mv`): the next start trains epoch 2 and saves.
    os.replace(run_dir / "checkpoint.prev.pt", run_dir / "checkpoint.pt")
    kept = (run_dir / "checkpoint.pt").read_bytes()
    limit = len(kept) // 2
    assert (run_dir / "metrics.jsonl").stat().st_size < limit // 4  # appending the metrics still fits

    def file_size_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          preexec_fn=file_size_limit)

    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"ddp-train: error: cannot write the checkpoint {run_dir}/checkpoint.pt (EFBIG: ")
    assert f"file-size limit (ulimit -f) {limit} bytes" in lines[0]
    assert f"MiB free in {run_dir}" in lines[0]
    assert "the checkpoint already there is unchanged" in lines[0]
    assert (run_dir / "checkpoint.pt").read_bytes() == kept
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_write_failure_without_an_oserror_still_names_the_limits(tmp_path):
    failure = write_failure.describe(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704"),
                                     tmp_path)
    line = write_failure.message("checkpoint", tmp_path / "checkpoint.pt", failure, "kept")
    assert "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704" in line
    assert f"MiB free in {tmp_path}" in line and "file-size limit (ulimit -f) " in line


def test_a_metrics_record_that_does_not_fit_is_undone_to_the_last_whole_line(tmp_path, monkeypatch):
    from ddp_train import metrics

    log = metrics.MetricsWriter(tmp_path, enabled=True)
    log.write("run", note="first")
    real_write = os.write

    def half_then_full(fd, data):  # a disk that fills mid-line: a short write, then ENOSPC
        if len(data) > 10:
            return real_write(fd, data[:10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(metrics.os, "write", half_then_full)
    log.write("epoch", note="second")
    monkeypatch.setattr(metrics.os, "write", real_write)

    assert [r["type"] for r in metrics.read_metrics(log.path)] == ["run"]
    assert log.path.read_text().endswith("\n")
    assert "No space left on device" in str(log.failed) and str(tmp_path) in str(log.failed)
    log.write("summary")  # nothing more after a failure: the trainer stops on it
    assert [r["type"] for r in metrics.read_metrics(log.path)] == ["run"]
