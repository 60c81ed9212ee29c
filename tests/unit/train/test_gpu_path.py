"""The GPU path's decisions, checked on CPU: cached normalisation constants, compile and batch
defaults, the LR rule, one GPU per rank, the delayed stop vote, and a warm-up that changes nothing.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from train_helpers import TINY_ARGS, run_trainer, trainer_env
from ddp_train.fast import speed
from ddp_train.recipe import data
from ddp_train.fast.cudagraph_report import uses_cuda_graphs
from ddp_train.config import config_from_args
from ddp_train.resolve import compile_by_default, for_device, peak_lr, resolve_compile_mode
from ddp_train.distributed import DistEnv, gpu_index
from ddp_train.errors import TrainError
from ddp_train.recipe.model import WideResNet


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_normalize_is_the_per_channel_standard_score_in_the_requested_dtype(dtype):
    # What the model sees: (pixel / 255 - mean) / std per channel, in the step's dtype, on every call
    # (its constants are cached per device and dtype, so a later call must not get another's).
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    mean, std = torch.tensor(data.MEAN).view(1, 3, 1, 1), torch.tensor(data.STD).view(1, 3, 1, 1)
    want = (images.double() / 255 - mean.double()) / std.double()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for _ in range(3):
        got = data.normalize(images, dtype)
        assert got.dtype == dtype and got.shape == images.shape
        assert torch.allclose(got.double(), want, atol=tolerance), (got.double() - want).abs().max()


def test_compile_is_on_by_default_on_cuda_only_and_both_flags_work():
    default, on, off = (config_from_args(a) for a in ([], ["--compile"], ["--no-compile"]))
    assert compile_by_default(default, "cuda") and not compile_by_default(default, "cpu")
    assert compile_by_default(on, "cpu") and not compile_by_default(off, "cuda")


def test_cuda_graphs_are_the_cuda_default_and_a_mode_flag_overrides():
    assert resolve_compile_mode(config_from_args([]), "cuda") == "reduce-overhead"
    assert resolve_compile_mode(config_from_args([]), "cpu") == "default"
    chosen = config_from_args(["--compile-mode", "max-autotune-no-cudagraphs"])
    assert resolve_compile_mode(chosen, "cuda") == "max-autotune-no-cudagraphs"
    assert uses_cuda_graphs("reduce-overhead") and not uses_cuda_graphs("default")


def test_improved_recipe_has_no_dropout_module_and_the_guide_keeps_its_dropout():
    improved, guide = config_from_args([]), config_from_args(["--recipe", "guide"])
    assert (improved.dropout, guide.dropout) == (0.0, 0.01)
    kinds = lambda m: {type(x) for x in m.modules()}  # noqa: E731
    assert torch.nn.Dropout not in kinds(WideResNet(100, 1 / 16, improved.dropout))
    assert torch.nn.Dropout in kinds(WideResNet(100, 1 / 16, guide.dropout))


def test_default_batch_is_1024_per_gpu_and_the_lr_follows_the_global_batch():
    config = config_from_args(["--base-lr", "0.05"])
    on_8_gpus = for_device(config, "cuda", 8)
    assert on_8_gpus.batch_size == 8 * 1024
    assert peak_lr(on_8_gpus, 8) == pytest.approx(0.05 * 8192 / 512)
    assert for_device(config, "cpu", 2).batch_size == 512
    explicit = for_device(config_from_args(["--batch-size", "512"]), "cuda", 4)
    # The same global batch gives the same LR on 1 or 4 GPUs under the batch rule.
    assert explicit.batch_size == 512 and peak_lr(explicit, 4) == peak_lr(explicit, 1) == pytest.approx(0.05)


def test_more_local_ranks_than_gpus_is_one_line_naming_both_counts():
    with pytest.raises(TrainError) as caught:
        gpu_index(DistEnv(rank=1, world_size=2, local_rank=1, local_world_size=2), visible=1)
    message = str(caught.value)
    assert "2 processes on this node" in message and "only 1 GPU(s) visible" in message
    assert "\n" not in message
    assert gpu_index(DistEnv(rank=5, world_size=8, local_rank=1, local_world_size=4), visible=4) == 1


def test_a_task_bound_to_its_own_gpu_takes_the_one_it_sees_whatever_its_local_rank():
    # srun --gpus-per-task=1, as ddp-launch's slurm-task mode describes it: torch's LOCAL_RANK (1 of 4
    # on the node) and DDP_TASK_DEVICE naming its GPU among the one it sees.
    bound = DistEnv(rank=5, world_size=8, local_rank=1, local_world_size=4, task_device=0)
    assert gpu_index(bound, visible=1) == 0
    with pytest.raises(TrainError, match="DDP_TASK_DEVICE=0 but this task sees 0 GPU"):
        gpu_index(bound, visible=0)


def test_compile_cache_goes_to_the_flag_then_the_variable_then_the_run_dir(tmp_path):
    env = {speed.INDUCTOR_CACHE_VARIABLE: "/scratch/inductor"}
    assert speed.compile_cache_dir("/mine", tmp_path, env) == Path("/mine")
    assert speed.compile_cache_dir("", tmp_path, env) == Path("/scratch/inductor")
    assert speed.compile_cache_dir("", tmp_path, {}) == tmp_path / "compile-cache"


def tiny_training(seed: int = 0):
    torch.manual_seed(seed)
    model = WideResNet(10, 1 / 16, dropout=0.2)  # dropout: the warm-up must restore the RNG too
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return model, optimizer, scaler, step


def test_warm_up_leaves_weights_statistics_optimizer_and_rng_as_they_were():
    cpu = torch.device("cpu")
    plain_model, _, _, plain_step = tiny_training()
    plain_losses = [plain_step() for _ in range(3)]
    warm_model, warm_opt, warm_scaler, warm_step = tiny_training()
    seconds = speed.warm_up(warm_step, 2, [warm_model, warm_opt, warm_scaler], cpu)
    assert seconds > 0 and warm_opt.state_dict()["state"] == {}
    warm_losses = [warm_step() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, warm_losses))  # same dropout masks too
    for a, b in zip(plain_model.state_dict().values(), warm_model.state_dict().values()):
        assert torch.equal(a, b)  # weights and BatchNorm running statistics after 3 real steps


DELAYED_VOTE = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    from ddp_train.distributed import DelayedMax
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    vote = DelayedMax(torch.device("cpu"))
    seen = [vote.read()]             # nothing launched yet
    vote.launch(7 if rank == 1 else 0)
    seen.append(vote.read())         # rank 1's value, on every rank
    seen.append(vote.read())         # read once: nothing pending now
    vote.launch(0)
    vote.launch(3 if rank == 0 else 0)  # a newer vote replaces an unread one
    seen.append(vote.read())
    # One file per rank: two ranks printing to one pipe can interleave their writes.
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
        json.dump(seen, out)
    dist.destroy_process_group()
""")


def test_delayed_stop_vote_gives_every_rank_the_same_answer(tmp_path):
    script = tmp_path / "vote.py"
    script.write_text(DELAYED_VOTE)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script), str(tmp_path)],
                          env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert seen == [[0, 7, 0, 3], [0, 7, 0, 3]]


def summary_and_epochs(run_dir: Path) -> tuple[dict, list[dict]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return ([r for r in records if r["type"] == "summary"][-1], [r for r in records if r["type"] == "epoch"])


def test_summary_reports_steady_images_per_s_without_the_first_epoch(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "3", "--target-accuracy", "1.1"])
    assert result.returncode == 0, result.stderr
    summary, epochs = summary_and_epochs(tmp_path)
    assert [e["warm_up_epoch"] for e in epochs] == [True, False, False]
    steady = sum(e["images"] for e in epochs[1:]) / sum(e["epoch_time_s"] for e in epochs[1:])
    assert summary["steady_images_per_s"] == pytest.approx(steady)
    assert summary["total_time_s"] == pytest.approx(sum(e["epoch_time_s"] for e in epochs))
    assert f"Throughput: {steady:.3f} images/second (steady state" in result.stdout
    assert summary["setup_time_s"] == 0.0  # eager CPU: nothing to warm up


def test_bf16_gradient_compression_is_registered_and_two_gloo_ranks_stay_identical(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "1", "--grad-compression", "bf16"], torchrun_nproc=2)
    assert result.returncode == 0, result.stderr
    summary, _ = summary_and_epochs(tmp_path)
    assert summary["ddp"]["comm_hook"] == "bf16_compress_hook"
    assert summary["ranks_in_sync"]


def test_compiled_run_warms_up_off_the_clock_into_the_run_dirs_compile_cache(ten_class_data, tmp_path):
    # The one end-to-end run of the compile path here: inductor's CPU backend with the C++
    # compiler this machine has (about two minutes on two shared cores, almost all compiling).
    # TORCHINDUCTOR_COMPILE_THREADS=1: inductor compiles in this process rather than in a pool of workers that
    # each import torch again (torch._inductor.config, compile_threads): 86 against 73 CPU-s here.
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "1", "--limit-train", "64", "--compile"], timeout=600,
                         env_extra={"TORCHINDUCTOR_COMPILE_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    summary, epochs = summary_and_epochs(tmp_path)
    assert "Warm-up (default, 1 pass(es), outside the training time)" in result.stdout
    assert "CUDA graphs: not used (CPU: CUDA graphs need a GPU)" in result.stdout
    assert summary["setup_time_s"] > 0 and summary["total_time_s"] == pytest.approx(epochs[0]["epoch_time_s"])
    cached = [p for p in (tmp_path / "compile-cache").rglob("*") if p.is_file()]
    assert cached, "inductor wrote nothing under <run-dir>/compile-cache"
