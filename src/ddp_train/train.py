"""The training run, top to bottom: world, data, model, resume, the epoch loop, the summary.

Speed comes from the data path: the whole dataset sits on the device as uint8, batches are
gathered, augmented and normalised there (no DataLoader workers), the model runs in
channels_last under bf16 autocast, compiled with CUDA graphs on GPUs (fast/speed.py), and nothing
syncs the GPU inside an epoch: the stop-signal vote is read one check after it started.
(On CPU the model stays NCHW: measured faster; it runs under bf16 autocast where the CPU
computes bf16 natively, precision.py.)
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

import torch

from ddp_contract import heartbeat as hb
from ddp_contract import provenance, same_run

from ddp_train import distributed, metrics, recovery
from ddp_train.fast import cudagraph_report, speed
from ddp_train.recipe import data
from ddp_train.checkpoint import Checkpointer, Progress, checkpoint_path
from ddp_train.console import Console
from ddp_train.config import TrainConfig
from ddp_train.distributed import DistEnv
from ddp_train.errors import EXIT_OK, EXIT_REQUEUE
from ddp_train.recipe.evaluate import evaluate, target_reached
from ddp_train.recipe.learner import Learner, accumulate_gradients, build_learner, lr_at, update_ema
from ddp_train.precision import agree_cpu_bf16, read_cpu_bf16
from ddp_train.resolve import Decisions, resolve
from ddp_train.progress import ProgressBar
from ddp_train.safety import heartbeat, peers, rundir, steptime
from ddp_train.safety.signals import StopFlag, StopVote


def run(config: TrainConfig, env: Mapping[str, str]) -> int:
    started = recovery.StartClock.started(env)  # a recovery's record measures this start (recovery.py)
    dist_env = DistEnv.from_env(env)
    device = distributed.pick_device(config.device, dist_env)
    cpu_bf16 = read_cpu_bf16(env) if device.type == "cpu" else None  # once per process
    decided = resolve(config, device.type, dist_env.world_size,
                      device.type == "cuda" and torch.cuda.is_bf16_supported(), cpu_bf16)
    config = decided.config
    if decided.compiled:
        # Before torch writes its /tmp default into os.environ (creating an optimizer does). Inductor
        # reads its cache directory from the process environment: written there, not read from it.
        speed.use_compile_cache(speed.compile_cache_dir(config.compile_cache_dir, config.run_dir, env),
                                os.environ)
    stop = StopFlag.installed_for(config.run_dir, dist_env.is_main)
    # Hang forensics before the process group: torch reads the Flight Recorder's variables then.
    forensics = heartbeat.Forensics.for_run(env, dist_env.rank, dist_env.local_rank, config.run_dir,
                                            config.dist_timeout_s, os.environ)
    try:
        distributed.init_process_group(dist_env, device, config.dist_timeout_s, config.backend)
        if cpu_bf16 is not None and config.precision == "auto":  # nodes' CPUs may differ: one answer for all
            decided = decided.with_cpu_bf16(agree_cpu_bf16(distributed.all_gather_objects(cpu_bf16)))
        hosts = peers.hosts_by_rank(env) if dist_env.world_size > 1 else []
        started.mark("group_ready_at")
        with rundir.held_by_this_job(Path(config.run_dir), env, dist_env.is_main, device,
                                     fresh=config.resume is False) as moved_to:
            console = Console(dist_env.is_main)
            if moved_to:
                console.say(f"--no-resume: the earlier run's checkpoints and metrics are kept in {moved_to}/")
            try:
                if config.fabric_gate:  # before the data and the model: a bad node costs no more than the gate
                    from ddp_train.gate.run import on_the_training_group
                    code = on_the_training_group(config.site, config.run_dir, config.backend, config.dist_timeout_s,
                                                 dist_env, device, env)
                    started.mark("gate_done_at")
                    if code != EXIT_OK:
                        return code
                return train(decided, Live(env, dist_env, device, stop, forensics.heartbeat, console, started))
            except RuntimeError as exc:  # a failed collective: was it a node that went away?
                saved = checkpoint_path(config.run_dir)
                lost = peers.roll_call(hosts, dist_env.rank, exc, str(saved) if saved.exists() else "",
                                       env.get("MASTER_ADDR", "?"), run_dir=str(config.run_dir),
                                       env=env) if hosts else None
                if lost is None:
                    raise
                if lost.prints and lost.report:  # for the job script: a spare can take the node's place
                    peers.write_report(config.run_dir, lost.report)
                raise lost from None
    finally:
        forensics.stop()
        distributed.destroy_process_group()
        stop.uninstall()


@dataclass(frozen=True)
class Live:
    """The run's live parts, started by run() before train() and stopped after it: the environment, this
    process's place in the process group, its device, the stop request, the heartbeat, the console and
    the start's clock."""

    env: Mapping[str, str]
    dist_env: DistEnv
    device: torch.device
    stop: StopFlag
    beat: heartbeat.Heartbeat
    console: Console
    started: recovery.StartClock = dataclasses.field(default_factory=recovery.StartClock)


@dataclass
class Run:
    """One training run's parts, built once by set_up: the loop reads them and goes back to neither the
    world (distributed) nor the flags (config) for anything else. progress is the one that changes."""

    decided: Decisions
    live: Live
    log: metrics.MetricsWriter
    data: data.RunData
    learner: Learner
    checkpoints: Checkpointer
    resumed: Optional[Progress]
    progress: Progress
    clock: steptime.StepClock
    fast: speed.FastModel
    world: distributed.World

    @property
    def config(self) -> TrainConfig:
        return self.decided.config

    @property
    def dist_env(self) -> DistEnv:
        return self.live.dist_env

    @property
    def device(self) -> torch.device:
        return self.live.device

    @property
    def console(self) -> Console:
        return self.live.console

    @property
    def beat(self) -> heartbeat.Heartbeat:
        return self.live.beat


def train(decided: Decisions, live: Live) -> int:
    wall_start = time.perf_counter()
    config, console, beat = decided.config, live.console, live.beat
    run = set_up(decided, live)
    introduce(run)
    train_step = step_function(run, steptime.slowdown_s_for_tests(live.env, live.dist_env.rank))
    warm_up(run, train_step)
    live.started.mark("training_at")
    report_recovery(run)

    # The loop: every rank takes the same steps and makes the same decisions.
    progress, votes = run.progress, StopVote(live.stop, live.device, config.stop_check_every)
    stopped_by: Optional[str] = None
    first_epoch_here = True
    for epoch in range(progress.epoch, config.epochs):
        if progress.finished:
            break
        trained = train_epoch(run, epoch, train_step, votes)
        progress.add_training_time(trained.images, trained.seconds, warm_up_epoch=first_epoch_here)
        warm_up_epoch, first_epoch_here = first_epoch_here, False
        stopped_by = trained.stopped_by
        if stopped_by:
            progress.step = trained.step
            break

        if evaluate_epoch(run, epoch, trained, warm_up_epoch):
            progress.early_stopped = True
            console.say(f"Target accuracy reached. Early stopping after epoch {epoch + 1}.")
            break
        stopped_by = votes.at_epoch_end()
        if stopped_by or (config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0):
            beat.phase(hb.CHECKPOINT)
            run.checkpoints.save(progress)
        if stopped_by:
            break

    if stopped_by:
        return leave_for_requeue(run, stopped_by)
    return finish(run, time.perf_counter() - wall_start)


def set_up(decided: Decisions, live: Live) -> Run:
    """The data, the learner, the checkpoint to resume, DDP and the step clock, once (the run dir is
    ready: run() holds it)."""
    config, dist_env, device, beat, started = decided.config, live.dist_env, live.device, live.beat, live.started
    log = metrics.MetricsWriter(config.run_dir, enabled=dist_env.is_main)
    run_data = data.prepare(config, dist_env, device)  # uint8, on the device

    # The model and what trains it; then the checkpoint, if there is one to resume.
    learner = build_learner(decided, dist_env.rank, device)
    checkpoints = Checkpointer(config, learner, dist_env, device)
    started.mark("resume_started_at")
    resumed = checkpoints.resume()
    started.mark("resume_done_at")
    if dist_env.is_main:
        rundir.warn_if_low_space(Path(config.run_dir), learner.state_bytes())
    clock = steptime.StepClock(device, enabled=dist_env.world_size > 1 and heartbeat.wanted(live.env))

    def on_bucket() -> None:  # DDP's comm hook, as each gradient bucket goes to the all-reduce
        beat.bucket()
        clock.bucket()

    # DDP (after the resume: it broadcasts rank 0's weights), with the comm hook when timing steps.
    fast = speed.accelerate(learner.model, decided, device, on_bucket if clock.enabled else None)
    clock.enabled = clock.enabled and not fast.cuda_graphs
    if clock.enabled and not fast.compiled:
        # After DDP's forward broadcast its buffers: the time before it is waiting for peers.
        learner.model.register_forward_pre_hook(lambda _module, _inputs: clock.forward_started())
    return Run(decided, live, log, run_data, learner, checkpoints, resumed, resumed or Progress(), clock, fast,
               distributed.describe_world(dist_env, device))


def introduce(run: Run) -> None:
    """The transport line, the manifest, the run record and the header."""
    config, console, precision = run.config, run.console, run.decided.precision
    distributed.announce_network_transport(run.live.env, run.device, run.dist_env.local_rank, config.backend)
    # What exactly ran: every rank's mapped libraries (a collective), rank 0's manifest and its lines.
    every_rank = distributed.all_gather_objects(provenance.this_process())
    if run.dist_env.is_main:
        console.say(*provenance.record(config.run_dir, dataclasses.asdict(config), os.environ, every_rank,
                                       str(torch.__version__)))
    start = metrics.RunStart(run.world, config, precision.name, run.decided.lr_peak, run.decided.compile_mode,
                             run.data.steps, len(run.data.train_set), len(run.data.test_set), run.resumed, precision.reason,
                             run.data.generated_in)
    run.log.write("run", **start.record())
    # Rank 0's write failed (a full disk, in the run dir or under its logs): every rank stops.
    distributed.agree_or_raise(run.log.failed or console.failed, run.device)
    console.say(start.header(), precision.line())
    if run.data.note:
        console.say(run.data.note)
    if run.resumed:
        console.say(f"Resumed from {run.checkpoints.path} at epoch {run.progress.epoch + 1}, step {run.progress.step}")
    extended = extension(run)
    if extended is not None:
        run.log.write("extended", **extended.record())
        console.say(extended.line())


def extension(run: Run) -> Optional[metrics.Extended]:
    """What this start changed in the checkpoint's plan, with the LR there under both plans: the learning
    rate is a function of the step and the plan's total steps (lr_at), so the new plan's schedule
    goes on from the step reached (ddp_contract.same_run.LR_RULE)."""
    change = run.checkpoints.plan_change
    if change is None:
        return None
    steps, config, peak = run.data.steps, run.config, run.decided.lr_peak
    at = change.at_epoch * steps.per_epoch + change.at_step
    return metrics.Extended(change.epochs_from, change.epochs_to, change.at_epoch, change.at_step, at,
                            lr_at(at, steps.per_epoch * change.epochs_from, steps.warmup, peak, config.schedule),
                            lr_at(at, steps.total, steps.warmup, peak, config.schedule),
                            change.early_stop_lifted, same_run.LR_RULE, same_run.EARLY_STOP_RULE)


def step_function(run: Run, slow_s: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One optimizer step on a batch: forward and backward per micro-batch, the step, the EMA."""
    config, learner, fast, clock, beat = run.config, run.learner, run.fast, run.clock, run.beat
    device_type, autocast_dtype, scaler, optimizer = run.device.type, learner.autocast_dtype, learner.scaler, learner.optimizer

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if fast.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous pass's graph outputs are done
        with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
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
        if learner.ema is not None:
            update_ema(learner.ema, learner.model, config.ema_decay)
        return loss

    return train_step


def warm_up(run: Run, train_step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Off the clock: compile, autotune and record graphs on a real batch, then restore. Then whether each
    rank's compiled step runs as a CUDA graph, or inductor's reason: said, never assumed."""
    progress, fast, learner, device = run.progress, run.fast, run.learner, run.device
    passes = speed.warmup_passes(device, fast.compiled, fast.cuda_graphs) if not progress.finished else 0
    if passes:
        batches = run.data.batches
        warm_x, warm_y = batches.batch(batches.permutation(progress.epoch), progress.epoch, progress.step)
        learner.model.train()
        run.beat.phase(hb.WARMUP)
        setup_s = speed.warm_up(lambda: train_step(warm_x, warm_y), passes, [learner], device)
        progress.setup_time_s += setup_s
        run.console.say(f"Warm-up ({fast.describe()}, {passes} pass(es), outside the training time): {setup_s:.1f} s")
    run.console.say(*cudagraph_report.gather(fast.graph_state(device)).lines())


def report_recovery(run: Run) -> None:
    """Training again after spares took bad nodes' places: the recovery's record and line (recovery.py)."""
    if run.dist_env.is_main and not run.progress.finished:
        recovery.announce(run.live.env, run.live.started, run.log, run.console)


@dataclass(frozen=True)
class EpochTrained:
    """What one epoch's training (train_epoch) did, up to its end or a stop the ranks agreed on."""
    stopped_by: Optional[str]  # the signal the ranks agreed to stop for; None: the epoch ran to its end
    step: int  # the step reached inside the epoch
    seconds: float
    images: int  # trained in this call (a resumed epoch counts from where it resumed)
    train_loss: float  # the mean over this call's steps
    last_lr: float


def train_epoch(run: Run, epoch: int, train_step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                votes: StopVote) -> EpochTrained:
    """The epoch's steps from where progress stands, until its end or a stop the ranks agreed on."""
    config, progress, steps, learner, clock = run.config, run.progress, run.data.steps, run.learner, run.clock
    perm, first_step, step = run.data.batches.permutation(epoch), progress.step, progress.step
    learner.model.train()
    loss_sum = torch.zeros((), device=run.device)
    bar = ProgressBar(steps.per_epoch, f"Epoch {epoch + 1}/{config.epochs}", run.dist_env.is_main, run.console)
    stopped_by: Optional[str] = None
    lr = run.decided.lr_peak
    t0 = time.perf_counter()
    while step < steps.per_epoch:
        stopped_by = votes.during_epoch(step, first_step)
        if stopped_by:
            break
        x, y = run.data.batches.batch(perm, epoch, step)
        lr = lr_at(epoch * steps.per_epoch + step, steps.total, steps.warmup, run.decided.lr_peak, config.schedule)
        learner.set_lr(lr)
        run.beat.step(epoch * steps.per_epoch + step)
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
    return EpochTrained(stopped_by, step, epoch_time, (step - first_step) * config.batch_size, train_loss, lr)


def evaluate_epoch(run: Run, epoch: int, trained: EpochTrained, warm_up_epoch: bool) -> bool:
    """The trained epoch's evaluation, its line and record; whether the target accuracy is reached."""
    config, progress, console = run.config, run.progress, run.console
    run.beat.phase(hb.EVAL)
    result = evaluate(run.learner.for_evaluation(), run.data.test_set, run.dist_env.rank, run.dist_env.world_size,
                      config.eval_batch_size, run.learner.autocast_dtype, config.tta)
    progress.epoch, progress.step = epoch + 1, 0
    progress.add_accuracy(result.accuracy)
    end = metrics.EpochEnd(epoch + 1, config.epochs, trained.seconds, trained.images, trained.train_loss, result,
                           trained.last_lr, warm_up_epoch)
    console.say(end.line())
    run.log.write("epoch", **end.record())
    distributed.agree_or_raise(run.log.failed or console.failed, run.device)
    return target_reached(progress.accuracies, config.target_accuracy, config.patience)


def leave_for_requeue(run: Run, stopped_by: str) -> int:
    """A checkpoint, then exit 75: the job script requeues and the next start resumes."""
    progress, checkpoints = run.progress, run.checkpoints
    if progress.step:  # a mid-epoch stop; an epoch-end stop has just saved
        checkpoints.save(progress)
    stopped = metrics.Stopped(stopped_by, progress.epoch, progress.step, checkpoints.path, EXIT_REQUEUE)
    run.log.write("stopped", **stopped.record())
    run.console.say(stopped.line())
    run.live.stop.clear_request()
    distributed.barrier()
    return EXIT_REQUEUE


def finish(run: Run, wall_s: float) -> int:
    """The last checkpoint, the summary record and lines, and every rank leaving together."""
    progress, console, device = run.progress, run.console, run.device
    if progress.finished and progress.early_stopped and progress.epoch < run.config.epochs:
        console.say(f"{run.checkpoints.path} is a run that stopped early at its target (the last "
                    f"{run.config.patience} epochs reach --target-accuracy {run.config.target_accuracy:g}): "
                    f"nothing left to train; a higher --target-accuracy trains on to --epochs {run.config.epochs}")
    elif progress.finished:
        console.say(f"{run.checkpoints.path} is a finished run: nothing left to train")
    else:
        progress.finished = True
        run.checkpoints.save(progress)
    run.beat.phase(hb.DONE)
    digests = distributed.parameter_digests(run.learner.model)
    step_times = steptime.gather(run.clock, run.dist_env.rank)
    graphs = cudagraph_report.gather(run.fast.graph_state(device))
    if len(set(digests)) != 1:
        console.say(f"WARNING: model parameters differ across ranks ({digests}): please report this")
    run.log.write("summary", **metrics.summary_record(progress, run.world, digests, speed.bucket_layout(run.fast.ddp),
                                                      wall_s), **step_times.record(), **graphs.record())
    console.say(*metrics.summary_lines(progress, run.world, run.log.path), *step_times.lines(), *graphs.lines())
    distributed.agree_or_raise(run.log.failed or console.failed, device)  # a finished run's record is whole, or exit 2
    # Leave together: no rank exits while a peer still waits in a collective. The process then
    # leaves through exit_edge.leave_now, which explains the abort at exit that this barrier alone left.
    distributed.barrier()
    return EXIT_OK
