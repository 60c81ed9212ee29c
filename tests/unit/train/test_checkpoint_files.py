"""Checkpoints are written atomically, the previous one is kept, a corrupt one is a clear error."""

import pytest
import torch

from ddp_train import checkpoint
from ddp_train.errors import TrainError


def state(value: float) -> dict:
    return {"model": {"w": torch.full((4,), value)}, "progress": {"epoch": int(value)}, "optimizer": {},
            "scaler": {}, "rng": [], "config": {}}


def test_save_replaces_and_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic(state(1), path)
    checkpoint.save_atomic(state(2), path)
    assert checkpoint.load(path)["progress"]["epoch"] == 2
    assert checkpoint.load(tmp_path / "checkpoint.prev.pt")["progress"]["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


def test_crash_during_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic(state(1), path)
    before = path.read_bytes()

    def crash_half_way(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crash_half_way)
    with pytest.raises(OSError, match="No space"):
        checkpoint.save_atomic(state(2), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary left behind


def test_corrupt_checkpoint_is_a_clear_error_pointing_at_the_previous_one(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic(state(1), path)
    checkpoint.save_atomic(state(2), path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(TrainError, match=r"corrupt or unreadable.*checkpoint.prev.pt"):
        checkpoint.load(path)


def test_a_foreign_file_is_not_taken_for_a_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"weights": torch.zeros(1)}, path)
    with pytest.raises(TrainError, match="not a ddp-train checkpoint"):
        checkpoint.load(path)


def test_a_zero_byte_checkpoint_is_a_clear_error_not_an_index_error(tmp_path):
    # What a full disk leaves; the handler itself used to crash on the empty exception message.
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic(state(1), path)
    checkpoint.save_atomic(state(2), path)
    path.write_bytes(b"")
    with pytest.raises(TrainError, match=r"is empty \(0 bytes.*`mv .*checkpoint.prev.pt .*checkpoint.pt`"):
        checkpoint.load(path)


def test_an_exception_without_a_message_still_names_the_problem(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"x")

    def fails_silently(*args, **kwargs):
        raise EOFError()

    monkeypatch.setattr(torch, "load", fails_silently)
    with pytest.raises(TrainError, match=r"corrupt or unreadable \(EOFError\); --no-resume starts fresh"):
        checkpoint.load(path)
