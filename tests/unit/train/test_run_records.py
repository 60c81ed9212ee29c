"""What the run records say: progress and throughput across restarts (checkpoint.Progress), the
metrics.jsonl records' fields, the step plan, and the early-stop and stop-vote decisions."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from ddp_train import metrics
from ddp_train.checkpoint import Progress
from ddp_train.config import config_from_args
from ddp_train.recipe.data import Split, TrainBatches
from ddp_train.distributed import World
from ddp_train.recipe.evaluate import EvalResult, target_reached
from ddp_train.recipe.data import plan_steps
from ddp_train.safety.signals import StopFlag, StopVote

WORLD = World(size=8, nodes=2, processes_per_node=4, device="cuda", gpu_model="NVIDIA GH200",
              cpu_model="aarch64", threads_per_process=8, versions={"torch": "2.x"})


def test_the_first_epoch_of_each_start_is_left_out_of_the_steady_throughput():
    progress = Progress()
    progress.add_training_time(1000, 10.0, warm_up_epoch=True)  # lazy loading, allocator growth
    progress.add_training_time(1000, 1.0, warm_up_epoch=False)
    progress.add_training_time(1000, 1.0, warm_up_epoch=False)

    assert progress.steady_images_per_s == 1000.0
    assert progress.images_per_s == 3000 / 12.0


def test_a_single_epoch_per_start_falls_back_to_the_overall_throughput():
    progress = Progress()
    progress.add_training_time(600, 2.0, warm_up_epoch=True)
    assert progress.steady_images_per_s == progress.images_per_s == 300.0
    assert Progress().images_per_s == 0.0  # nothing trained (a finished run started again)


def test_accuracies_keep_the_best_and_the_last():
    progress = Progress()
    for accuracy in (0.3, 0.6, 0.5):
        progress.add_accuracy(accuracy)
    assert (progress.final_accuracy, progress.best_accuracy) == (0.5, 0.6)
    assert Progress().final_accuracy == 0.0


def test_progress_round_trips_through_the_checkpoints_dict():
    # Checkpointer saves asdict(progress) and resumes with Progress(**saved): no derived field in it.
    from dataclasses import asdict
    progress = Progress(epoch=2, step=5, accuracies=[0.1, 0.2], train_time_s=3.0, images=64)
    assert Progress(**asdict(progress)) == progress


@pytest.mark.parametrize("accuracies,expected", [
    ([0.9, 0.9], True),
    ([0.9, 0.7, 0.9], False),  # the last two must both reach it
    ([0.95], False),  # one epoch is not `patience` epochs
    ([0.5, 0.86, 0.9], True),
])
def test_early_stop_needs_patience_epochs_at_the_target(accuracies, expected):
    assert target_reached(accuracies, target=0.85, patience=2) is expected


def test_steps_drop_the_last_partial_batch_so_every_rank_takes_the_same():
    steps = plan_steps(train_images=1000, batch_size=96, world_size=4, epochs=3, warmup_epochs=0.5)
    assert (steps.per_epoch, steps.total, steps.warmup, steps.batch_per_rank) == (10, 30, 5, 24)


def test_each_ranks_batch_is_the_share_the_step_plan_records_and_the_ranks_cover_the_global_batch():
    images = torch.zeros(1000, 3, 32, 32, dtype=torch.uint8)
    train_set = Split(images, torch.arange(1000))
    steps = plan_steps(train_images=1000, batch_size=96, world_size=4, epochs=1, warmup_epochs=0)
    ranks = [TrainBatches(train_set, 96, seed=0, rank=rank, world_size=4) for rank in range(4)]
    perm = ranks[0].permutation(epoch=0)
    labels = [batches.batch(perm, epoch=0, step=1)[1] for batches in ranks]
    assert [len(y) for y in labels] == [steps.batch_per_rank] * 4
    assert torch.equal(torch.cat(labels), perm[96:192])  # step 1's global batch, split in rank order


def test_the_run_record_has_the_fields_plotting_and_ddp_bench_read():
    config = config_from_args(["--batch-size", "256"])
    resumed = Progress(epoch=3, step=7)
    start = metrics.RunStart(WORLD, config, "bf16", 0.08, "reduce-overhead",
                             plan_steps(50000, 256, 8, 5, 0), 50000, 10000, resumed, "auto, on a GPU")

    record = start.record()

    assert list(record) == [
        "world_size", "nodes", "gpus_per_node", "processes_per_node", "device", "gpu_model", "cpu_model",
        "precision", "precision_reason", "batch_size", "batch_size_per_rank", "lr", "compile_mode", "train_images",
        "test_images", "steps_per_epoch", "versions", "resumed_from_epoch", "resumed_from_step",
        "data_generated_in", "config"]
    assert (record["gpus_per_node"], record["batch_size_per_rank"], record["steps_per_epoch"]) == (4, 32, 195)
    assert (record["resumed_from_epoch"], record["resumed_from_step"]) == (3, 7)
    assert (record["precision"], record["precision_reason"]) == ("bf16", "auto, on a GPU")
    json.dumps(record)  # a metrics.jsonl line
    assert start.header() == ("ddp-train: 8 process(es) on 2 node(s), NVIDIA GH200, bf16, global batch 256 "
                              "(32 per rank), lr 0.08, recipe improved, reduce-overhead, 195 steps per epoch")


def test_a_fresh_start_records_no_resume_point_and_a_cpu_world_no_gpus():
    cpu = World(size=1, nodes=1, processes_per_node=1, device="cpu", gpu_model=None, cpu_model="x86_64",
                threads_per_process=2, versions={})
    start = metrics.RunStart(cpu, config_from_args(["--batch-size", "32"]), "fp32", 0.01, "eager",
                             plan_steps(64, 32, 1, 1, 0), 64, 16, None)
    record = start.record()
    assert (record["resumed_from_epoch"], record["resumed_from_step"], record["gpus_per_node"]) == (None, None, 0)
    assert record["data_generated_in"] is None  # CIFAR-100 itself, not --demo's generated set
    assert "CPU (2 threads per process)" in start.header()


def test_the_epoch_stopped_and_summary_records():
    epoch = metrics.EpochEnd(2, 5, 4.0, 1000, 3.5, EvalResult(correct=30, total=100, loss_sum=250.0), 0.1, False)
    assert epoch.record() == dict(epoch=2, epoch_time_s=4.0, images=1000, images_per_s=250.0, train_loss=3.5,
                                  val_loss=2.5, val_accuracy=0.3, val_correct=30, val_total=100, lr=0.1,
                                  warm_up_epoch=False)
    assert epoch.line().startswith("Epoch 2/5: 4.000 s, 250.0 images/s, train loss 3.5000")

    stopped = metrics.Stopped("SIGUSR2", 2, 40, Path("runs/a/checkpoint.pt"), 75)
    assert stopped.record()["checkpoint"] == "runs/a/checkpoint.pt" and stopped.record()["exit_code"] == 75
    assert "at epoch 3, step 40" in stopped.line() and "(exit code 75)" in stopped.line()

    progress = Progress(epoch=5, accuracies=[0.5, 0.7], best_accuracy=0.7, train_time_s=10.0, images=5000)
    summary = metrics.summary_record(progress, WORLD, ["ab", "ab"], None, 12.5)
    assert list(summary) == [
        "total_time_s", "images_per_s", "steady_images_per_s", "steady_time_s", "setup_time_s", "ddp",
        "wall_time_s", "nodes", "gpus_per_node", "world_size", "final_accuracy", "best_accuracy", "epochs_run",
        "early_stopped", "parameter_digests", "ranks_in_sync"]
    assert summary["ranks_in_sync"] and summary["images_per_s"] == 500.0
    assert not metrics.summary_record(progress, WORLD, ["ab", "cd"], None, 1.0)["ranks_in_sync"]
    lines = metrics.summary_lines(progress, WORLD, Path("runs/a/metrics.jsonl"))
    assert "Total GPUs used: 8" in lines and lines[-1] == "Training completed successfully."


def test_a_stop_is_seen_one_check_after_the_vote_started():
    # The in-epoch vote is read one check after it was launched, so the host never waits on it.
    flag = StopFlag()
    votes = StopVote(flag, torch.device("cpu"), check_every=10)
    flag.signum = signal.SIGUSR2
    assert votes.during_epoch(step=0, first_step=0) is None  # no check at the first step
    assert votes.during_epoch(step=5, first_step=0) is None  # not a check step
    assert votes.during_epoch(step=10, first_step=0) is None  # launches the vote
    assert votes.during_epoch(step=20, first_step=0) == "SIGUSR2"  # reads it


def test_the_vote_at_an_epoch_end_is_immediate():
    flag = StopFlag()
    votes = StopVote(flag, torch.device("cpu"), check_every=10)
    assert votes.at_epoch_end() is None
    flag.signum = signal.SIGTERM
    assert votes.at_epoch_end() == "SIGTERM"
