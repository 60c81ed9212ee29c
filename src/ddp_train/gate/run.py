"""The fabric gate: `ddp-train --fabric-gate` runs it in the training's own ranks before their first step
(on_the_training_group), and `python -m ddp_train.gate` as a step of its own before a user's script,
through ddp-launch (`--module ddp_train.gate`) on the same ranks, backend and environment as the training.

All-reduce at a few sizes with a known pattern (data checked, bandwidth as nccl-tests reports it);
on a failure, or where only a comparison can judge, again within each node and between pairs of
nodes, to name the node or link at fault, and a pair round whose pair looks slow up to twice more
before any node is named (judge.remeasured); none of those where the site profile forbids subgroups
(gate_subgroups: a second process group can hang on its stack). Writes gate.json and gate.txt in
--run-dir; exit 0 pass, 76 (ddp_contract.EXIT_BAD_NODE) when it names a node, 1 when it fails
without naming one.
The decisions are in judge.py.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from ddp_contract import EXIT_BAD_NODE, EXPECT_FABRIC_VAR, GATE_TEST_CORRUPT_VAR
from ddp_contract.nccl_log import check_nccl_transport
from ddp_contract.provenance import SITE_VAR

from ddp_train import distributed, write_failure
from ddp_train.config import BACKENDS
from ddp_train.console import Console
from ddp_train.distributed import DistEnv
from ddp_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE, Seen, TrainError
from ddp_train.exit_edge import in_a_job_of_several, leave_now, prints_here, say_once
from ddp_train.gate.judge import (DEFAULT_ITERS, DEFAULT_SIZES, PATTERN_PERIOD, Expectation, GroupResult,
                                  SizeResult, decide, expectation_from_profile, expected_period, judged_expectation,
                                  link_expectation, needs_narrowing, pair_rounds, port_rate_gbits, remeasured,
                                  subgroups_refused, write_report)
from ddp_train.resolve import resolve_backend


# How long any one of the gate's collectives may take: a hang at the gate is the fabric's fault to name,
# within two minutes, not after a training's --dist-timeout-s (600 s by default).
GATE_TIMEOUT_S = 120.0


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddp_train.gate", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="where gate.json and gate.txt go")
    parser.add_argument("--site", default=os.environ.get(SITE_VAR) or None,
                        help="site profile whose fabric_gate gives the expected bus bandwidth")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="as the trainer's --backend: auto is NCCL on GPUs, gloo on CPUs")
    parser.add_argument("--sizes", help="comma-separated sizes in bytes (default: per device, gate/judge.py)")
    parser.add_argument("--iters", type=int, help="timed all-reduces per size (default 20 on GPUs, 5 on CPUs)")
    parser.add_argument("--timeout", type=float, default=GATE_TIMEOUT_S, help="seconds any one collective may take")
    return parser.parse_args(argv)


def site_profile(site: Optional[str], env: Mapping[str, str]):
    """The site profile (ddp_contract.sites.SiteProfile) named by --site, or None without one."""
    if not site:
        return None
    from ddp_contract.errors import LaunchError
    from ddp_contract.sites import load_site
    try:
        return load_site(site, env)
    except LaunchError as error:
        raise TrainError(str(error)) from None


def site_refuses_subgroups(profile) -> Optional[str]:
    """Why this site's gate builds no process group but the world's (its gate_subgroups), or None."""
    rule = profile.gate_subgroups if profile is not None else None
    return subgroups_refused(profile.name if profile else None, rule.allowed if rule else None,
                             rule.source if rule else "")


def nccl_hca_selects(spec: str, device: str, port: str) -> bool:
    """Whether NCCL_IB_HCA lets NCCL use device:port: a list of name prefixes, '=' for exact names, '^' to
    exclude, ':port' to name one port (NCCL's environment variables page, NCCL_IB_HCA)."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    named = False
    for entry in filter(None, spec.split(",")):
        name, _, only_port = entry.partition(":")
        if (device == name if exact else device.startswith(name)) and (not only_port or only_port == port):
            named = True
    return not named if exclude else named


def node_link_gbits(env: Mapping[str, str], root: str = "/") -> Optional[float]:
    """This node's RDMA line rate in Gb/s: the active ports NCCL may use, summed (None: none, or sockets)."""
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return None
    base = Path(root) / "sys/class/infiniband"
    spec = env.get("NCCL_IB_HCA", "")
    total = 0.0
    for device in sorted(base.iterdir()) if base.is_dir() else ():
        for port in sorted((device / "ports").iterdir()) if (device / "ports").is_dir() else ():
            if spec and not nccl_hca_selects(spec, device.name, port.name):
                continue
            try:
                # state: "4: ACTIVE" (the kernel's sysfs ABI, as ibstat prints it).
                if "ACTIVE" not in (port / "state").read_text():
                    continue
                total += port_rate_gbits((port / "rate").read_text()) or 0.0
            except OSError:
                continue
    return total or None


def corruption(env: Mapping[str, str], host: str, local_rank: int) -> int:
    """How many elements this rank perturbs (test only: DDP_GATE_TEST_CORRUPT=HOST:LOCAL_RANK:COUNT)."""
    raw = env.get(GATE_TEST_CORRUPT_VAR)
    if not raw:
        return 0
    try:
        node, rank, count = raw.rsplit(":", 2)
        return int(count) if node == host and int(rank) == local_rank else 0
    except ValueError:
        raise TrainError(f"{GATE_TEST_CORRUPT_VAR}={raw!r} is not HOST:LOCAL_RANK:COUNT") from None


class Runner:
    """One rank's side of the gate: its device, its global rank, and every rank's node."""

    def __init__(self, device: torch.device, rank: int, nodes_of_ranks: Sequence[str], corrupt: int, iters: int,
                 timeout_s: float):
        self.device, self.rank, self.nodes_of_ranks = device, rank, list(nodes_of_ranks)
        self.corrupt, self.iters, self.timeout_s = corrupt, iters, timeout_s

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def pattern(self, count: int) -> torch.Tensor:
        index = torch.arange(count, device=self.device, dtype=torch.int64)
        values = ((index + self.rank) % PATTERN_PERIOD + 1).to(torch.float32)
        if self.corrupt:
            values[: self.corrupt] += 1
        return values

    def expected(self, members: Sequence[int], count: int) -> torch.Tensor:
        period = torch.tensor(expected_period(members), dtype=torch.float32, device=self.device)
        return period[torch.arange(count, device=self.device) % PATTERN_PERIOD]

    def measure(self, group, members: Sequence[int], round_name: str, sizes: Sequence[int]) -> GroupResult:
        results = []
        for size in sizes:
            count = size // 4
            data = self.pattern(count)
            all_reduce(data, group)
            wrong = int((data != self.expected(members, count)).sum())
            scratch = torch.zeros(count, device=self.device)
            all_reduce(scratch, group)  # warm-up: connections and buffers
            self.sync()
            all_reduce(torch.zeros(1, device=self.device), group)  # start together
            self.sync()
            started = time.perf_counter()
            for _ in range(self.iters):
                all_reduce(scratch, group)
            self.sync()
            seconds = (time.perf_counter() - started) / self.iters
            # The slowest member's time and the most wrong elements any member saw: the group's row.
            worst = torch.tensor([seconds, float(wrong)], dtype=torch.float64 if self.device.type == "cpu"
                                 else torch.float32, device=self.device)
            all_reduce(worst, group, dist.ReduceOp.MAX)
            results.append(SizeResult.measured(size, float(worst[0]), len(members), int(worst[1])))
        nodes = tuple(dict.fromkeys(self.nodes_of_ranks[r] for r in members))
        return GroupResult(round_name, nodes, len(members), tuple(results))

    def round(self, round_name: str, groups: Sequence[Sequence[int]], sizes: Sequence[int]) -> list[GroupResult]:
        """Every group of one round at once (each rank in at most one); every rank gets every result."""
        # Every rank creates every group; a new group's timeout is torch's default (10 or 30 min), not the
        # world's, unless given.
        handles = [dist.new_group(list(members), timeout=datetime.timedelta(seconds=self.timeout_s))
                   for members in groups]
        mine, joined = None, None
        for members, handle in zip(groups, handles):
            if self.rank in members:
                mine, joined = self.measure(handle, members, round_name, sizes), handle
        gathered = distributed.all_gather_objects(mine)  # also: every member is done with every group
        if joined is not None:
            # Its communicator and buffers are not the training's to keep (on_the_training_group runs on
            # the training's own process group).
            dist.destroy_process_group(joined)
        seen, results = set(), []
        for result in gathered:
            if result is not None and result.nodes not in seen:
                seen.add(result.nodes)
                results.append(result)
        return results


def all_reduce(tensor: torch.Tensor, group, op=None) -> None:
    """dist.all_reduce within `group` (None: the world); nothing to do in a world of one."""
    if distributed.active():
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group)


def node_names(hostnames: Sequence[str]) -> list[str]:
    """The nodes in rank order (a node is first seen at its lowest rank)."""
    return list(dict.fromkeys(hostnames))


def transport_on_sockets(env: Mapping[str, str], device: torch.device) -> bool:
    """Whether this rank's NCCL chose TCP sockets where the launcher expects an RDMA fabric."""
    if device.type != "cuda" or not env.get(EXPECT_FABRIC_VAR):
        return False
    ok, message = check_nccl_transport({**env, "DDP_REQUIRE_FABRIC": "1"})
    return not ok


@dataclass(frozen=True)
class GateSettings:
    """What the gate measures and judges by: the site's published figure (None: comparison alone), why
    the site forbids subgroups (None: it allows them), the sizes in bytes, the timed all-reduces and the
    seconds any one collective may take."""

    expectation: Optional[Expectation]
    refused: Optional[str]
    sizes: tuple[int, ...]
    iters: int
    timeout_s: float


def settings(site: Optional[str], sizes: Optional[str], iters: Optional[int], timeout_s: float, device_type: str,
             env: Mapping[str, str]) -> GateSettings:
    profile = site_profile(site, env)
    return GateSettings(expectation_from_profile(profile.fabric_gate) if profile is not None else None,
                        site_refuses_subgroups(profile),
                        tuple(int(s) for s in sizes.split(",")) if sizes else DEFAULT_SIZES[device_type],
                        iters or DEFAULT_ITERS[device_type], timeout_s)


def judge_on_group(chosen: GateSettings, backend: str, dist_env: DistEnv, device: torch.device,
                   env: Mapping[str, str], started: float):
    """The gate's rounds on the process group already initialised with `backend` (the gate's own, or the
    training's; none in a world of one): the world's all-reduce, then within nodes and pairs where judging
    needs it. Every rank returns the same report (judge.GateReport)."""
    expectation, refused, sizes = chosen.expectation, chosen.refused, chosen.sizes
    host = socket.gethostname().split(".")[0]
    hosts = distributed.all_gather_objects(host)
    nodes = node_names(hosts)
    if expectation is None and (backend, device.type) == ("nccl", "cuda"):
        # No published figure: the RDMA links' own rate, which NCCL's IB transport runs on.
        rates = distributed.all_gather_objects(node_link_gbits(env))
        expectation = link_expectation(dict(zip(hosts, rates)), sizes[-1])
    expectation, notes = judged_expectation(expectation, len(nodes), backend, device.type, pairs=refused is None)
    runner = Runner(device, dist_env.rank, hosts, corruption(env, host, dist_env.local_rank), chosen.iters,
                    chosen.timeout_s)
    everyone = list(range(dist_env.world_size))
    world = runner.measure(None, everyone, "world", sizes)
    on_sockets = distributed.all_gather_objects(transport_on_sockets(env, device))
    sockets = sorted({hosts[r] for r, flag in enumerate(on_sockets) if flag})
    node_groups, pair_groups = [], []
    if refused is not None and distributed.active():
        notes = (*notes, refused)  # the world's all-reduce alone: no dist.new_group on this site
    elif distributed.active() and needs_narrowing(world, expectation, sockets, len(nodes)):
        ranks_of = {node: [r for r, h in enumerate(hosts) if h == node] for node in nodes}
        node_groups = runner.round("node", [ranks_of[n] for n in nodes], sizes)
        schedule = {f"pairs-{index}": [ranks_of[nodes[a]] + ranks_of[nodes[b]] for a, b in pairs]
                    for index, pairs in enumerate(pair_rounds(len(nodes)), start=1)}
        for name, groups in schedule.items():
            pair_groups += runner.round(name, groups, sizes)
        # Every rank holds every result (round gathers them), so every rank repeats the same rounds.
        pair_groups, again = remeasured(pair_groups, expectation,
                                        lambda name: runner.round(name, schedule[name], sizes))
        notes = (*notes, *again)
    return decide(world, node_groups, pair_groups, expectation, sockets, time.perf_counter() - started,
                  f"{dist.get_backend() if distributed.active() else 'none'} on {device.type}", notes,
                  unnarrowed=refused if distributed.active() else None)


def exit_code(report) -> int:
    if report.ok:
        return EXIT_OK
    return EXIT_BAD_NODE if report.bad_nodes else EXIT_FAILURE


def published_by_rank_0(report, run_dir: str, is_main: bool, device: torch.device) -> None:
    """Rank 0 writes and says the report; a write that fails stops every rank with its one line."""
    failed = None
    if is_main:
        try:
            publish(report, run_dir)
        except TrainError as error:
            failed = error
    distributed.agree_or_raise(failed, device)


def gate(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    started = time.perf_counter()
    dist_env = DistEnv.from_env(env)
    device = distributed.pick_device(args.device, dist_env)
    chosen = settings(args.site, args.sizes, args.iters, args.timeout, device.type, env)
    backend = resolve_backend(args.backend, device.type)
    distributed.init_process_group(dist_env, device, args.timeout, backend)
    try:
        report = judge_on_group(chosen, backend, dist_env, device, env, started)
        published_by_rank_0(report, args.run_dir, dist_env.is_main, device)
    finally:
        distributed.destroy_process_group()
    return exit_code(report)


def on_the_training_group(site: str, run_dir: str, backend: str, training_timeout_s: float, dist_env: DistEnv,
                          device: torch.device, env: Mapping[str, str]) -> int:
    """`ddp-train --fabric-gate`: the gate on the training's own process group (its backend, its
    timeout), before the first step: exit 0 trains on, 76 names a node and 1 fails without naming one,
    with nothing trained. The job scripts run it this way for the built-in trainer (slurm/lib/ddp.sh,
    ddp::gate), which saves every rank a second container start, torch import and rendezvous; a user's
    own script gets the gate's separate step, its process group being its own."""
    started = time.perf_counter()
    chosen = settings(site or env.get(SITE_VAR) or None, None, None, min(GATE_TIMEOUT_S, training_timeout_s),
                      device.type, env)
    with collectives_bounded(chosen.timeout_s, training_timeout_s):
        report = judge_on_group(chosen, backend, dist_env, device, env, started)
    published_by_rank_0(report, run_dir, dist_env.is_main, device)
    return exit_code(report)


@contextlib.contextmanager
def collectives_bounded(seconds: float, then_s: float):
    """The world group's collectives time out after `seconds` inside the block, and after `then_s` again
    once it ends well (a group that timed out is the roll call's, never used again). torch.distributed's
    set_timeout, or its older private _set_pg_timeout, where this torch has one."""
    setter = getattr(dist, "set_timeout", None) or getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None or not distributed.active() or seconds >= then_s:
        yield
        return
    setter(datetime.timedelta(seconds=seconds))
    yield
    setter(datetime.timedelta(seconds=then_s))


NOTHING_CHANGED = "no training ran and no checkpoint changed"


def publish(report, run_dir: str) -> None:
    """gate.json and gate.txt in the run dir, the report on stdout. A write that fails (a full disk,
    a quota, a run dir that is not a directory) is one line, not a traceback: the trainer's rule
    (console.py)."""
    try:
        write_report(report, run_dir)
    except OSError as exc:
        path = Path(run_dir) / "gate.json"
        raise TrainError(write_failure.message("fabric gate report", path, write_failure.describe(exc, path.parent),
                                               NOTHING_CHANGED)) from None
    console = Console(enabled=True, kept=NOTHING_CHANGED)
    console.say(report.text(), f"fabric gate: report in {os.path.join(run_dir, 'gate.json')} and gate.txt")
    if console.failed:
        raise console.failed


def stop_requests_exit_75() -> None:
    """A stop signal (USR2 before the time limit, TERM on preemption, forwarded by ddp-launch) during
    the gate: nothing to save, so every rank leaves at once with 75 and the job script requeues."""
    def leave(signum, frame):
        os._exit(EXIT_REQUEUE)
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, leave)


def main(argv: Optional[Sequence[str]] = None) -> int:
    stop_requests_exit_75()
    try:
        code = gate(parse_args(argv), os.environ)
    except TrainError as error:
        # Every rank checks the same flags, site and devices, and only rank 0 writes the report:
        # rank 0 says it.
        say_once("fabric gate", prints_here(Seen.BY_EVERY_RANK, os.environ), str(error), os.environ)
        code = EXIT_USAGE
    if in_a_job_of_several(os.environ):
        leave_now(code)  # gloo's threads and interpreter finalization: exit_edge.leave_now
    return code

