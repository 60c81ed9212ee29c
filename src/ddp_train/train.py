"""The training run, top to bottom: world, data, model, resume, the epoch loop, the summary.

Speed comes from the data path: the whole dataset sits on the device as uint8, batches are
gathered, augmented and normalised there (no DataLoader workers), the model runs in
channels_last under bf16 autocast, compiled with CUDA graphs on GPUs (speed.py), and nothing
syncs the GPU inside an epoch: the stop-signal vote is read one check after it started.
(On CPU the model stays NCHW: measured faster.)
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Mapping, Optional

import torch

from ddp_contract import heartbeat as hb

from ddp_train import cudagraph_report, data, distributed, metrics, recovery, speed
from ddp_train.checkpoint import Checkpointer, Progress, checkpoint_path
from ddp_train.console import Console
from ddp_train.config import (TrainConfig, check_world, compile_by_default, for_device, resolve_backend,
                              resolve_precision)
from ddp_train.data import TrainBatches
from ddp_train.distributed import DistEnv
from ddp_train.errors import EXIT_OK, EXIT_REQUEUE, Seen, seen_by
from ddp_train.evaluate import evaluate, target_reached
from ddp_train.learner import accumulate_gradients, build_learner, lr_at, plan_steps, update_ema
from ddp_train.progress import ProgressBar
from ddp_train.safety import heartbeat, peers, provenance, rundir, steptime
from ddp_train.safety.signals import StopFlag, StopVote, stop_request_path


def run(config: TrainConfig, env: Mapping[str, str]) -> int:
    started = recovery.StartClock.started(env)  # a recovery's record measures this start (recovery.py)
    dist_env = DistEnv.from_env(env)
    with seen_by(Seen.BY_EVERY_RANK_OF_NODE):  # the same GPUs for every rank of a node
        device = distributed.pick_device(config.device, dist_env)
    config = for_device(config, device.type, dist_env.world_size)
    with seen_by(Seen.BY_EVERY_RANK):  # the same flags and world size on every rank: rank 0 tells
        check_world(config, dist_env.world_size)  # after for_device: the default batch is checked too
    if compile_by_default(config, device.type):
        # Before torch writes its /tmp default into os.environ (creating an optimizer does). Inductor
        # reads its cache directory from the process environment: written there, not read from it.
        speed.use_compile_cache(speed.compile_cache_dir(config.compile_cache_dir, config.run_dir, env),
                                os.environ)
    with seen_by(Seen.BY_EVERY_RANK_OF_NODE):
        precision = resolve_precision(config.precision, device.type,
                                      device.type == "cuda" and torch.cuda.is_bf16_supported())
        config = dataclasses.replace(config, backend=resolve_backend(config.backend, device.type))  # recorded
    stop = StopFlag(stop_request_path(config.run_dir) if dist_env.is_main else None).install()
    # Hang forensics before the process group: torch reads the Flight Recorder's variables then.
    forensics = heartbeat.Forensics.start(env, dist_env.rank, dist_env.local_rank, config.run_dir,
                                          config.dist_timeout_s) if heartbeat.wanted(env) else heartbeat.Forensics.off()
    heartbeat.use_run_dir_for_flight_recorder(config.run_dir, env, os.environ)
    try:
        distributed.init_process_group(dist_env, device, config.dist_timeout_s, config.backend)
        hosts = peers.hosts_by_rank(env) if distributed.active() else []
        started.mark("group_ready_at")
        with rundir.held_by_this_job(Path(config.run_dir), env, dist_env.is_main, device):
            try:
                return train(config, env, dist_env, device, precision, stop, forensics.heartbeat,
                             Console(dist_env.is_main), started)
            except RuntimeError as exc:  # a failed collective: was it a node that went away?
                lost = peers.roll_call(hosts, dist_env.rank, exc, str(checkpoint_path(config.run_dir)),
                                       env.get("MASTER_ADDR", "?")) if hosts else None
                if lost is None:
                    raise
                if lost.prints and lost.report:  # for the job script: a spare can take the node's place
                    peers.write_report(config.run_dir, lost.report)
                raise lost from None
    finally:
        forensics.stop()
        distributed.destroy_process_group()
        stop.uninstall()


def record_provenance(config: TrainConfig, dist_env: DistEnv, console: Console) -> None:
    """The run's manifest, from every rank's mapped libraries (a collective), and its three lines."""
    every_rank = distributed.all_gather_objects(provenance.this_process())
    if not dist_env.is_main:
        return
    prefix = hb.flight_recorder_prefix(config.run_dir)
    trainer_set = {name: "Flight Recorder dumps into <run-dir>/forensics" for name in heartbeat.FR_DUMP_VARS
                   if os.environ.get(name) == prefix}
    manifest = provenance.manifest(dataclasses.asdict(config), os.environ, trainer_set, every_rank,
                                   str(torch.__version__))
    provenance.write(config.run_dir, manifest)
    console.say(*provenance.summary_lines(manifest))


def train(config: TrainConfig, env: Mapping[str, str], dist_env: DistEnv, device: torch.device,
          precision: str, stop: StopFlag, beat: heartbeat.Heartbeat, console: Console,
          started: Optional[recovery.StartClock] = None) -> int:
    started = started or recovery.StartClock()
    wall_start = time.perf_counter()
    rank, world = dist_env.rank, dist_env.world_size
    log = metrics.MetricsWriter(config.run_dir, enabled=dist_env.is_main)
    speed.tune_backends(device)
    # The run dir before anything else: writable, and an earlier run moved aside under --no-resume.
    moved_to = rundir.prepare_on_rank0(Path(config.run_dir), config.resume is False, dist_env.is_main, device)
    if moved_to:
        console.say(f"--no-resume: the earlier run's checkpoints and metrics are kept in {moved_to}/")
    train_set, test_set, data_note = data.prepare(config, dist_env.is_main, device)  # uint8, on the device

    # The model and what trains it; then the checkpoint, if there is one to resume.
    learner = build_learner(config, dist_env, device, precision)
    model, ema, optimizer, scaler = learner.model, learner.ema, learner.optimizer, learner.scaler
    checkpoints = Checkpointer(config, learner, dist_env, device)
    started.mark("resume_started_at")
    resumed = checkpoints.resume()
    started.mark("resume_done_at")
    progress = resumed or Progress()
    if dist_env.is_main:
        rundir.warn_if_low_space(Path(config.run_dir), checkpoints.estimated_bytes())
    clock = steptime.StepClock(device, enabled=distributed.active() and heartbeat.wanted(env))

    def on_bucket() -> None:  # DDP's comm hook, as each gradient bucket goes to the all-reduce
        beat.bucket()
        clock.bucket()

    # DDP (after the resume: it broadcasts rank 0's weights), with the comm hook when timing steps.
    fast = speed.accelerate(model, config, device, on_bucket if clock.enabled else None)
    clock.enabled = clock.enabled and not fast.cuda_graphs
    if clock.enabled and not fast.compiled:
        # After DDP's forward broadcast its buffers: the time before it is waiting for peers.
        model.register_forward_pre_hook(lambda _module, _inputs: clock.forward_started())
    slow_s = steptime.slowdown_s_for_tests(env, rank)

    # The run record and the header.
    world_facts = distributed.describe_world(dist_env, device)
    distributed.announce_network_transport(env, device, dist_env.local_rank, config.backend)
    record_provenance(config, dist_env, console)
    steps = plan_steps(len(train_set), config.batch_size, world, config.epochs, config.warmup_epochs)
    start = metrics.RunStart(world_facts, config, precision, learner.lr_peak, fast.compile_mode, steps,
                             len(train_set), len(test_set), resumed)
    log.write("run", **start.record())
    # Rank 0's write failed (a full disk, in the run dir or under its logs): every rank stops.
    distributed.agree_or_raise(log.failed or console.failed, device)
    console.say(start.header())
    if data_note:
        console.say(data_note)
    if resumed:
        console.say(f"Resumed from {checkpoints.path} at epoch {progress.epoch + 1}, step {progress.step}")

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if fast.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous pass's graph outputs are done
        with torch.autocast(device.type, dtype=learner.autocast_dtype or torch.float32,
                            enabled=learner.autocast_dtype is not None):
            return learner.criterion(fast.forward(x), y)

    def backward(micro_loss: torch.Tensor) -> None:
        if slow_s:  # a test-only straggler: slower compute on one rank, after its forward began
            time.sleep(slow_s / config.grad_accum_steps)
        scaler.scale(micro_loss).backward()

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = accumulate_gradients(x, y, config.grad_accum_steps, fast.ddp, loss_of, backward)
        clock.backward_done()
        beat.phase(hb.OPTIMIZER)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:
            update_ema(ema, model, config.ema_decay)
        return loss

    # Warm-up, off the clock: compile, autotune and record graphs on a real batch, then restore.
    batches = TrainBatches(train_set, config.batch_size, config.seed, rank, world)
    passes = speed.warmup_passes(device, fast.compiled, fast.cuda_graphs) if not progress.finished else 0
    if passes:
        warm_x, warm_y = batches.batch(batches.permutation(progress.epoch), progress.epoch, progress.step)
        model.train()
        beat.phase(hb.WARMUP)
        setup_s = speed.warm_up(lambda: train_step(warm_x, warm_y), passes, model, optimizer, scaler, device, ema)
        progress.setup_time_s += setup_s
        console.say(f"Warm-up ({fast.describe()}, {passes} pass(es), outside the training time): {setup_s:.1f} s")
    # Said, never assumed: whether each rank's compiled step runs as a CUDA graph, or inductor's reason.
    console.say(*cudagraph_report.gather(fast.graph_state(device)).lines())

    # Training again after spares took bad nodes' places: the recovery's record and line (recovery.py).
    started.mark("training_at")
    recovered = recovery.from_env(env) if dist_env.is_main and recovery.first_start(env) else None
    if recovered is not None and not progress.finished:
        log.write("recovery", **recovery.record(recovered, started))
        console.say(recovery.line(recovered, started))

    # The loop: every rank takes the same steps and makes the same decisions.
    votes = StopVote(stop, device, config.stop_check_every)
    stopped_by: Optional[str] = None
    first_epoch_here = True
    for epoch in range(progress.epoch, config.epochs):
        if progress.finished:
            break
        perm, first_step, step = batches.permutation(epoch), progress.step, progress.step
        model.train()
        loss_sum = torch.zeros((), device=device)
        bar = ProgressBar(steps.per_epoch, f"Epoch {epoch + 1}/{config.epochs}", dist_env.is_main, console)
        t0 = time.perf_counter()
        while step < steps.per_epoch:
            stopped_by = votes.during_epoch(step, first_step)
            if stopped_by:
                break
            x, y = batches.batch(perm, epoch, step)
            lr = lr_at(epoch * steps.per_epoch + step, steps.total, steps.warmup, learner.lr_peak, config.schedule)
            learner.set_lr(lr)
            beat.step(epoch * steps.per_epoch + step)
            clock.begin()
            loss_sum += train_step(x, y)
            clock.end()
            step += 1
            bar.update(step, (step - first_step) * config.batch_size)
        train_loss = loss_sum.item() / max(1, step - first_step)  # .item() waits for the GPU
        epoch_time = time.perf_counter() - t0
        bar.close()
        clock.epoch_end()
        votes.drain()
        images = (step - first_step) * config.batch_size
        progress.add_training_time(images, epoch_time, warm_up_epoch=first_epoch_here)
        warm_up_epoch, first_epoch_here = first_epoch_here, False
        if stopped_by:
            progress.step = step
            break

        beat.phase(hb.EVAL)
        result = evaluate(learner.for_evaluation(), test_set, rank, world, config.eval_batch_size,
                          learner.autocast_dtype, config.tta)
        progress.epoch, progress.step = epoch + 1, 0
        progress.add_accuracy(result.accuracy)
        end = metrics.EpochEnd(epoch + 1, config.epochs, epoch_time, images, train_loss, result, lr, warm_up_epoch)
        console.say(end.line())
        log.write("epoch", **end.record())
        distributed.agree_or_raise(log.failed or console.failed, device)
        if target_reached(progress.accuracies, config.target_accuracy, config.patience):
            progress.early_stopped = True
            console.say(f"Target accuracy reached. Early stopping after epoch {epoch + 1}.")
            break
        stopped_by = votes.at_epoch_end()
        if stopped_by or (config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0):
            beat.phase(hb.CHECKPOINT)
            checkpoints.save(progress)
        if stopped_by:
            break

    if stopped_by:  # a checkpoint, then exit 75: the job script requeues and the next start resumes
        if progress.step:  # a mid-epoch stop; an epoch-end stop has just saved
            checkpoints.save(progress)
        stopped = metrics.Stopped(stopped_by, progress.epoch, progress.step, checkpoints.path, EXIT_REQUEUE)
        log.write("stopped", **stopped.record())
        console.say(stopped.line())
        stop.clear_request()
        distributed.barrier()
        return EXIT_REQUEUE

    if progress.finished:
        console.say(f"{checkpoints.path} is a finished run: nothing left to train")
    else:
        progress.finished = True
        checkpoints.save(progress)
    beat.phase(hb.DONE)
    digests = distributed.parameter_digests(model)
    step_times = steptime.gather(clock, rank)
    graphs = cudagraph_report.gather(fast.graph_state(device))
    if len(set(digests)) != 1:
        console.say(f"WARNING: model parameters differ across ranks ({digests}): please report this")
    log.write("summary", **metrics.summary_record(progress, world_facts, digests, speed.bucket_layout(fast.ddp),
                                                  time.perf_counter() - wall_start), **step_times.record(),
              **graphs.record())
    console.say(*metrics.summary_lines(progress, world_facts, log.path), *step_times.lines(), *graphs.lines())
    distributed.agree_or_raise(log.failed or console.failed, device)  # a finished run's record is whole, or exit 2
    # Leave together: no rank exits while a peer still waits in a collective. The process then
    # leaves through exit_edge.leave_now, which explains the abort at exit that this barrier alone left.
    distributed.barrier()
    return EXIT_OK
