"""Checkpoints are written atomically, the previous one is kept, a corrupt one is a clear error."""

import copy
import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from ddp_train import checkpoint
from ddp_train.distributed import DistEnv
from ddp_train.recipe.learner import build_learner, estimated_bytes
from ddp_train.resolve import resolve
from ddp_train.errors import TrainError

CPU = torch.device("cpu")


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


# Written by Checkpointer.save before the learner had a state_dict (tests/unit/train/data/
# make_checkpoint_fixture.py, at the commit that added this file): a width-1/32 learner with SGD momentum,
# an EMA and an fp16 loss scaler, two steps in, at epoch 1 step 2.
OLD_FORMAT = Path(__file__).parent / "data" / "checkpoint-written-before-learner-state-dict.pt"


def _fixture_learner(run_dir):
    from ddp_train.config import TrainConfig
    config = TrainConfig(width_scale=1 / 32, batch_size=8, ema_decay=0.5, precision="fp16", run_dir=str(run_dir),
                         epochs=3, seed=7)
    return config, build_learner(resolve(config, "cpu", 1, gpu_bf16=False, cpu_bf16=None), 0, CPU)


def _same(a, b) -> bool:
    """Nested state (dicts, lists, tensors, numbers) equal value for value, tensors exactly."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_checkpoint_of_the_format_already_written_resumes_into_the_learner_and_saves_the_same(tmp_path):
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    shutil.copyfile(OLD_FORMAT, old_dir / checkpoint.CHECKPOINT_NAME)
    saved = torch.load(OLD_FORMAT, map_location="cpu", weights_only=True)
    config, learner = _fixture_learner(old_dir)

    progress = checkpoint.Checkpointer(config, learner, DistEnv(0, 1, 0, 1), CPU).resume()

    assert progress == checkpoint.Progress(**saved["progress"]) and (progress.epoch, progress.step) == (1, 2)
    state = learner.state_dict()
    assert list(state) == ["model", "optimizer", "scaler", "ema"]
    assert all(_same(state[key], saved[key]) for key in state)  # weights, momentum, scale, EMA: all restored
    # Saved again, the file has the same keys in the same order, and the same values (but the torch version).
    checkpoint.Checkpointer(dataclasses.replace(config, run_dir=str(new_dir)), learner, DistEnv(0, 1, 0, 1),
                            CPU).save(progress)
    again = torch.load(new_dir / checkpoint.CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    assert list(again) == list(saved)
    assert all(_same(again[key], saved[key]) for key in saved if key not in ("config", "torch"))


def test_the_learners_state_goes_back_exactly_and_leaves_no_gradient(tmp_path):
    _, learner = _fixture_learner(tmp_path)
    before = copy.deepcopy(learner.state_dict())
    loss = learner.criterion(learner.model(torch.randn(4, 3, 32, 32)), torch.tensor([1, 2, 3, 4]))
    learner.scaler.scale(loss).backward()
    learner.scaler.step(learner.optimizer)
    learner.scaler.update()
    assert not _same(learner.state_dict()["model"], before["model"])
    learner.load_state_dict(before)
    assert _same(learner.state_dict(), before)
    assert all(p.grad is None for p in learner.model.parameters())
    # The size estimate counts the weights, the momentum buffers and the EMA's copy: three model states.
    assert learner.state_bytes() == estimated_bytes(learner.model, copies=3)
