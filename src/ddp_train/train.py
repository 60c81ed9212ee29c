"""The training run, top to bottom: world, data, model, resume, the epoch loop, the summary.

Speed comes from the data path: the whole dataset sits on the device as uint8, batches are
gathered, augmented and normalised there (no DataLoader workers), the model runs in
channels_last under bf16 autocast, compiled with CUDA graphs on GPUs (speed.py), and nothing
syncs the GPU inside an epoch: the stop-signal vote is read one check after it started.
(On CPU the model stays NCHW: measured faster.)
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import os
import platform
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.nn as nn

from ddp_train import checkpoint, distributed, rundir, speed
from ddp_train.augment import random_crop_flip
from ddp_train.config import (TrainConfig, check_world, compile_by_default, for_device, peak_lr,
                              resolve_compile_mode, resolve_precision)
from ddp_train.data import Split, load_cifar100, memory_format_for, normalize
from ddp_train.distributed import DelayedMax, DistEnv, agree_or_raise, max_over_ranks
from ddp_train.errors import EXIT_OK, EXIT_REQUEUE, Seen, TrainError, seen_by
from ddp_train.evaluate import EvalResult, evaluate
from ddp_train.layout import NUM_CLASSES, has_dataset
from ddp_train.metrics import MetricsWriter
from ddp_train.model import WideResNet
from ddp_train.progress import ProgressBar
from ddp_train.schedule import lr_at
from ddp_train.signals import StopFlag, signal_name
from ddp_train.synthetic import write_dataset

CROP_PADDING = 4
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
SYNTHETIC_DIRNAME = "synthetic-data"


@dataclass
class Progress:
    """Where the run is; saved in every checkpoint next to the weights."""
    epoch: int = 0  # epochs completed
    step: int = 0  # steps already done inside epoch `epoch` (after a mid-epoch stop)
    accuracies: list = field(default_factory=list)
    best_accuracy: float = 0.0
    train_time_s: float = 0.0
    images: int = 0
    # Epochs after the first of each process start: that one pays lazy loading and allocator
    # growth even after the warm-up pass, so it is left out of the steady images/s.
    steady_time_s: float = 0.0
    steady_images: int = 0
    setup_time_s: float = 0.0  # warm-up passes (compile, autotune, graph recording), off the clock
    early_stopped: bool = False
    finished: bool = False


def say(dist_env: DistEnv, *lines: str) -> None:
    if dist_env.is_main:
        print(*lines, sep="\n", flush=True)


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """Augmentation randomness is a function of the position, so a resumed run replays it."""
    prime = 1_000_003
    return (((seed * prime + epoch) * prime + step) * prime + rank) % (2**63)


def epoch_permutation(n: int, seed: int, epoch: int, device: torch.device) -> torch.Tensor:
    """The same shuffle on every rank (a CPU generator: identical on any device)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).to(device)


def rng_state(device: torch.device) -> dict[str, Any]:
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


@torch.no_grad()
def update_ema(ema: nn.Module, model: nn.Module, decay: float) -> None:
    ema_params = list(ema.parameters())
    torch._foreach_lerp_(ema_params, list(model.parameters()), 1.0 - decay)
    copy_buffers(ema, model)


@torch.no_grad()
def copy_buffers(dst: nn.Module, src: nn.Module) -> None:
    for d, s in zip(dst.buffers(), src.buffers()):
        d.copy_(s)


def parameter_digest(model: nn.Module) -> str:
    """A hash of the exact parameter bits: equal on every rank when DDP kept them in sync."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def versions(device: torch.device) -> dict[str, Optional[str]]:
    cuda = device.type == "cuda"
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": str(torch.backends.cudnn.version()) if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
    }


def run(config: TrainConfig, env: Mapping[str, str]) -> int:
    dist_env = DistEnv.from_env(env)
    with seen_by(Seen.BY_EVERY_RANK):  # the same flags and world size on every rank: rank 0 tells
        check_world(config, dist_env.world_size)
    with seen_by(Seen.BY_EVERY_RANK_OF_NODE):  # the same GPUs for every rank of a node
        device = distributed.pick_device(config.device, dist_env)
    config = for_device(config, device.type, dist_env.world_size)
    if compile_by_default(config, device.type):
        # Before torch writes its /tmp default into os.environ (creating an optimizer does).
        speed.use_compile_cache(speed.compile_cache_dir(config.compile_cache_dir, config.run_dir, env),
                                os.environ)
    bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
    with seen_by(Seen.BY_EVERY_RANK_OF_NODE):
        precision = resolve_precision(config.precision, device.type, bf16_ok)
    stop = StopFlag().install()
    try:
        distributed.init_process_group(dist_env, device, config.dist_timeout_s)
        return train(config, dist_env, device, precision, stop)
    finally:
        distributed.destroy_process_group()
        stop.uninstall()


def prepare_data(config: TrainConfig, dist_env: DistEnv, device: torch.device) -> tuple[Split, Split, str]:
    """Load (or, for --demo without real data, generate) the dataset; every rank agrees on errors."""
    data_dir, verify, note = Path(config.data_dir), not config.allow_unverified_data, ""
    if config.demo and not has_dataset(data_dir):
        data_dir, verify = Path(config.run_dir) / SYNTHETIC_DIRNAME, False
        n_train, n_test = config.limit_train or 4000, config.limit_test or 1000
        if dist_env.is_main and not has_dataset(data_dir):
            write_dataset(data_dir, train=n_train, test=n_test, seed=config.seed)
        distributed.barrier()
        note = (f"No CIFAR-100 in {config.data_dir}: using a generated CIFAR-format dataset "
                f"({n_train} train, {n_test} test images) in {data_dir}; run `make data` for the real one")
    error: Optional[Exception] = None
    train_set = test_set = None
    try:
        train_set, test_set = load_cifar100(data_dir, verify)
        train_set, test_set = train_set.head(config.limit_train), test_set.head(config.limit_test)
        if len(train_set) < config.batch_size:
            raise TrainError(f"--batch-size {config.batch_size} is larger than the training set "
                             f"({len(train_set)} images): pass a smaller batch")
    except TrainError as exc:
        error = exc
    agree_or_raise(error, device)
    assert train_set is not None and test_set is not None
    if config.limit_train or config.limit_test:
        note = note or (f"Using the first {len(train_set)} training and {len(test_set)} "
                        f"test images of {data_dir}")
    return train_set.to(device), test_set.to(device), note


def train(config: TrainConfig, dist_env: DistEnv, device: torch.device, precision: str,
          stop: StopFlag) -> int:
    wall_start = time.perf_counter()
    rank, world = dist_env.rank, dist_env.world_size
    run_dir = Path(config.run_dir)
    metrics = MetricsWriter(run_dir, enabled=dist_env.is_main)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")

    # The run dir, before anything else: writable, and an earlier run moved aside under --no-resume.
    prepare_error, moved_to = None, None
    if dist_env.is_main:
        try:
            moved_to = rundir.prepare(run_dir, fresh=config.resume is False,
                                      now=datetime.datetime.now(datetime.timezone.utc))
        except TrainError as exc:
            prepare_error = exc
    agree_or_raise(prepare_error, device)  # a collective: the other ranks wait for rank 0's moves
    if moved_to:
        say(dist_env, f"--no-resume: the earlier run's checkpoints and metrics are kept in {moved_to}/")

    # Data: uint8 tensors resident on the device.
    train_set, test_set, data_note = prepare_data(config, dist_env, device)

    # Model, optimiser, precision.
    torch.manual_seed(config.seed)  # identical initial weights on every rank
    model = WideResNet(NUM_CLASSES, config.width_scale, config.dropout)
    model = model.to(device, memory_format=memory_format_for(device))
    ema = copy.deepcopy(model).requires_grad_(False) if config.ema_decay > 0 else None
    lr_peak = peak_lr(config, world)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr_peak, momentum=config.momentum, nesterov=config.nesterov,
        weight_decay=config.weight_decay, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    autocast_dtype = AUTOCAST_DTYPES[precision]
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    torch.manual_seed(config.seed * 1_000_003 + rank + 1)  # per-rank dropout masks

    # Resume.
    ckpt_path = checkpoint.checkpoint_path(run_dir)
    resume = config.resume if config.resume is not None else ckpt_path.exists()
    progress, resumed_from = Progress(), None
    if resume:
        error: Optional[Exception] = None
        try:
            if not ckpt_path.exists():
                raise TrainError(f"--resume but there is no checkpoint at {ckpt_path}")
            state = checkpoint.load(ckpt_path)
            saved = state["config"]
            for key in ("width_scale", "batch_size", "epochs", "seed", "recipe"):
                if saved.get(key) != getattr(config, key):
                    raise TrainError(
                        f"{ckpt_path} was written with --{key.replace('_', '-')} {saved.get(key)}, "
                        f"this run has {getattr(config, key)}: use the same value, another --run-dir, "
                        f"or --no-resume (which keeps this run, moved aside into "
                        f"{run_dir}/checkpoint-<UTC time>/)")
            try:
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                scaler.load_state_dict(state["scaler"])
                if ema is not None and state.get("ema") is not None:
                    ema.load_state_dict(state["ema"])
                progress = Progress(**state["progress"])
                if len(state["rng"]) == world:
                    set_rng_state(state["rng"][rank], device)
            except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # edited or foreign state
                detail = (str(exc).strip().splitlines() or [""])[0][:120]
                raise TrainError(f"checkpoint {ckpt_path} does not fit this run ({type(exc).__name__}: "
                                 f"{detail}); {checkpoint.recovery_hint(ckpt_path)}") from None
            resumed_from = {"epoch": progress.epoch, "step": progress.step}
        except TrainError as exc:
            error = exc
        agree_or_raise(error, device)
    if dist_env.is_main:
        copies = 1 + (config.momentum > 0) + (ema is not None)  # weights, momentum, EMA
        space_warning = rundir.low_space_warning(run_dir, rundir.free_bytes(run_dir),
                                                 checkpoint.estimated_bytes(model, copies))
        if space_warning:
            print(space_warning, file=sys.stderr, flush=True)

    ddp_model: nn.Module = model
    if distributed.active():
        speed.check_compression_backend(config.grad_compression)
        ddp_model = speed.wrap_ddp(model, device, config.bucket_cap_mb, config.grad_compression)
    compiled = compile_by_default(config, device.type)
    compile_mode = resolve_compile_mode(config, device.type) if compiled else "eager"
    cuda_graphs = compiled and device.type == "cuda" and speed.uses_cuda_graphs(compile_mode)
    forward = ddp_model
    if compiled:
        forward = torch.compile(ddp_model, mode=compile_mode)

    def save(path: Path = ckpt_path) -> None:
        rngs = distributed.all_gather_objects(rng_state(device))  # collective: every rank
        if not dist_env.is_main:
            distributed.agree_or_raise(None, device)  # rank 0's write went through, or not
            return
        error: Optional[TrainError] = None
        try:
            checkpoint.save_atomic({
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "ema": ema.state_dict() if ema is not None else None,
                "progress": asdict(progress),
                "rng": rngs,
                "config": config.to_dict(),
                "world_size": world,
                "torch": str(torch.__version__),
            }, path)
        except OSError as exc:  # a disk that filled up, a quota, a file system gone read-only
            # save_atomic wrote a temporary file: whatever checkpoint was there is untouched.
            error = TrainError(f"cannot write the checkpoint {path} ({exc.strerror or exc}); the checkpoint "
                               f"already there is unchanged: free space or quota in {path.parent}, then run "
                               f"the same command again to resume")
        distributed.agree_or_raise(error, device)  # every rank stops together, one line from rank 0

    # Run record and header.
    nodes, per_node = distributed.count_nodes()
    transport_message = distributed.check_network_transport(os.environ, device)
    if transport_message and dist_env.local_rank == 0:  # one line per node, not per GPU
        print(f"[{socket.gethostname()}] {transport_message}", file=sys.stderr, flush=True)
    gpus_per_node = per_node if device.type == "cuda" else 0
    gpu_model = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    n_train, n_test = len(train_set), len(test_set)
    local_batch = config.batch_size // world
    steps_per_epoch = n_train // config.batch_size  # drop the last partial batch: equal steps per rank
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = round(config.warmup_epochs * steps_per_epoch)
    metrics.write(
        "run", world_size=world, nodes=nodes, gpus_per_node=gpus_per_node,
        processes_per_node=per_node, device=device.type, gpu_model=gpu_model,
        cpu_model=platform.processor() or platform.machine(), precision=precision,
        batch_size=config.batch_size, batch_size_per_rank=local_batch, lr=lr_peak, compile_mode=compile_mode,
        train_images=n_train, test_images=n_test, steps_per_epoch=steps_per_epoch,
        versions=versions(device), resumed_from_epoch=resumed_from and resumed_from["epoch"],
        resumed_from_step=resumed_from and resumed_from["step"], config=config.to_dict())
    what = gpu_model or f"CPU ({torch.get_num_threads()} threads per process)"
    say(dist_env, f"ddp-train: {world} process(es) on {nodes} node(s), {what}, {precision}, "
                  f"global batch {config.batch_size} ({local_batch} per rank), lr {lr_peak:g}, "
                  f"recipe {config.recipe}, {compile_mode}, {steps_per_epoch} steps per epoch")
    if data_note:
        say(dist_env, data_note)
    if resumed_from:
        say(dist_env, f"Resumed from {ckpt_path} at epoch {progress.epoch + 1}, step {progress.step}")

    # The step.
    augment_gen = torch.Generator(device=device)
    train_images, train_labels = train_set.images, train_set.labels

    def batch(perm: torch.Tensor, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = step * config.batch_size + rank * local_batch
        idx = perm[start:start + local_batch]
        augment_gen.manual_seed(step_seed(config.seed, epoch, step, rank))
        return normalize(random_crop_flip(train_images[idx], CROP_PADDING, augment_gen)), train_labels[idx]

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are done
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            loss = criterion(forward(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:
            update_ema(ema, model, config.ema_decay)
        return loss.detach()

    # Warm-up, off the clock: compile, autotune and record graphs on a real batch, then restore.
    passes = speed.warmup_passes(device, compiled, cuda_graphs) if not progress.finished else 0
    if passes:
        warm_x, warm_y = batch(epoch_permutation(n_train, config.seed, progress.epoch, device),
                               progress.epoch, progress.step)
        model.train()
        setup_s = speed.warm_up(lambda: train_step(warm_x, warm_y), passes, model, optimizer, scaler,
                                device, ema)
        progress.setup_time_s += setup_s
        say(dist_env, f"Warm-up ({compile_mode}, {passes} pass(es), outside the training time): "
                      f"{setup_s:.1f} s")

    # The loop.
    stop_vote = DelayedMax(device)
    stopped_by: Optional[str] = None
    last_eval: Optional[EvalResult] = None
    first_epoch_here = True
    for epoch in range(progress.epoch, config.epochs):
        if progress.finished:
            break
        perm = epoch_permutation(n_train, config.seed, epoch, device)
        first_step = progress.step
        model.train()
        loss_sum = torch.zeros((), device=device)
        bar = ProgressBar(steps_per_epoch, f"Epoch {epoch + 1}/{config.epochs}", dist_env.is_main)
        t0 = time.perf_counter()
        step = first_step
        while step < steps_per_epoch:
            if step > first_step and step % config.stop_check_every == 0:
                stop_signum = stop_vote.read()  # the vote started one check ago: no wait
                if stop_signum:
                    stopped_by = signal_name(stop_signum)
                    break
                stop_vote.launch(stop.signum)
            x, y = batch(perm, epoch, step)
            lr = lr_at(epoch * steps_per_epoch + step, total_steps, warmup_steps, lr_peak,
                       config.schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum += train_step(x, y)
            step += 1
            bar.update(step, (step - first_step) * config.batch_size)
        train_loss = loss_sum.item() / max(1, step - first_step)  # .item() waits for the GPU
        epoch_time = time.perf_counter() - t0
        bar.close()
        stop_vote.read()  # drain: the blocking check at the epoch's end sees the same flag
        images = (step - first_step) * config.batch_size
        progress.train_time_s += epoch_time
        progress.images += images
        warm_up_epoch, first_epoch_here = first_epoch_here, False
        if not warm_up_epoch:
            progress.steady_time_s += epoch_time
            progress.steady_images += images
        if stopped_by:
            progress.step = step
            break

        distributed.average_buffers(model)
        if ema is not None:
            copy_buffers(ema, model)
        last_eval = evaluate(ema or model, test_set, rank, world, config.eval_batch_size,
                             autocast_dtype, config.tta)
        progress.epoch, progress.step = epoch + 1, 0
        progress.accuracies.append(last_eval.accuracy)
        progress.best_accuracy = max(progress.best_accuracy, last_eval.accuracy)
        rate = images / epoch_time
        say(dist_env, f"Epoch {epoch + 1}/{config.epochs}: {epoch_time:.3f} s, {rate:,.1f} images/s, "
                      f"train loss {train_loss:.4f}, val loss {last_eval.loss:.4f}, "
                      f"val accuracy {last_eval.accuracy:.4f}")
        metrics.write("epoch", epoch=epoch + 1, epoch_time_s=epoch_time, images=images,
                      images_per_s=rate, train_loss=train_loss, val_loss=last_eval.loss,
                      val_accuracy=last_eval.accuracy, val_correct=last_eval.correct,
                      val_total=last_eval.total, lr=lr, warm_up_epoch=warm_up_epoch)
        recent = progress.accuracies[-config.patience:]
        if len(recent) == config.patience and all(a >= config.target_accuracy for a in recent):
            progress.early_stopped = True
            say(dist_env, f"Target accuracy reached. Early stopping after epoch {epoch + 1}.")
            break
        stop_signum = max_over_ranks(stop.signum, device)
        if stop_signum or (config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0):
            save()
        if stop_signum:
            stopped_by = signal_name(stop_signum)
            break

    if stopped_by:
        if progress.step:  # a mid-epoch stop; an epoch-end stop has just saved
            save()
        metrics.write("stopped", signal=stopped_by, epochs_completed=progress.epoch, step=progress.step,
                      checkpoint=str(ckpt_path), exit_code=EXIT_REQUEUE)
        say(dist_env, f"Stop requested ({stopped_by}): checkpoint saved to {ckpt_path} at epoch "
                      f"{progress.epoch + 1}, step {progress.step}. Run the same command again to resume "
                      f"(exit code {EXIT_REQUEUE}).")
        distributed.barrier()
        return EXIT_REQUEUE

    already_done = progress.finished
    progress.finished = True
    if not already_done:
        save()
    else:
        say(dist_env, f"{ckpt_path} is a finished run: nothing left to train")
    digests = distributed.all_gather_objects(parameter_digest(model))
    if len(set(digests)) != 1:
        say(dist_env, f"WARNING: model parameters differ across ranks ({digests}): please report this")
    final_accuracy = progress.accuracies[-1] if progress.accuracies else 0.0
    throughput = progress.images / progress.train_time_s if progress.train_time_s else 0.0
    # With a single epoch per process start there is no steady epoch: the overall figure stands in.
    steady = progress.steady_images / progress.steady_time_s if progress.steady_time_s else throughput
    metrics.write("summary", total_time_s=progress.train_time_s, images_per_s=throughput,
                  steady_images_per_s=steady, steady_time_s=progress.steady_time_s,
                  setup_time_s=progress.setup_time_s,
                  ddp=speed.bucket_layout(ddp_model) if isinstance(ddp_model, speed.DistributedDataParallel) else None,
                  wall_time_s=time.perf_counter() - wall_start, nodes=nodes,
                  gpus_per_node=gpus_per_node, world_size=world, final_accuracy=final_accuracy,
                  best_accuracy=progress.best_accuracy, epochs_run=progress.epoch,
                  early_stopped=progress.early_stopped, parameter_digests=digests,
                  ranks_in_sync=len(set(digests)) == 1)
    say(dist_env,
        "",
        "Training Summary:",
        f"Total training time: {progress.train_time_s:.3f} seconds",
        f"Throughput: {steady:.3f} images/second (steady state, each start's first epoch "
        f"excluded; {throughput:.3f} over all epochs)",
        f"Setup time (warm-up: compile, autotune, outside the training time): {progress.setup_time_s:.3f} seconds",
        f"Number of nodes: {nodes}",
        f"Number of GPUs per node: {gpus_per_node}",
        f"Total GPUs used: {gpus_per_node * nodes}",
        f"World size: {world}",
        f"Final accuracy: {final_accuracy:.4f}",
        f"Best accuracy: {progress.best_accuracy:.4f}",
        f"Metrics: {metrics.path}",
        "Training completed successfully.")
    sys.stdout.flush()
    # Leave together: no rank exits while a peer still waits in a collective. The process then
    # leaves through cli._leave_now, which explains the abort at exit that this barrier alone left.
    distributed.barrier()
    return EXIT_OK
