"""Already inside torchrun (TORCHELASTIC_RUN_ID is set): run the workload, never nest torchrun.

torchrun has set RANK, WORLD_SIZE, LOCAL_RANK and MASTER_* for this worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch.envvars import is_digits
from ddp_launch.facts import NodeFacts, ProbeQuestions
from ddp_launch.gpus import GrantVariables
from ddp_launch.job_identity import NO_IDENTITY, JobIdentity
from ddp_launch.launch_options import LaunchOptions
from ddp_launch.plan import Endpoint, LaunchPlan
from ddp_launch.rendezvous import ipv4_literal

# --mode names and their lines in ddp-launch --help.
MODES = {"torchrun": "TORCHELASTIC_RUN_ID set: already a torchrun worker, run the workload"}
# Auto detection's place (schedulers/__init__.py): first, so that a worker never nests torchrun.
DETECTION_PLACE = 10
HELP = ""
NODE_NAME: tuple[str, ...] = ()   # the launch that started torchrun exported DDP_NODE_NAME
GPU_GRANT = GrantVariables()   # torchrun's agent checked the GPUs; its workers check none
VARIABLES = {
    "run_id": ("TORCHELASTIC_RUN_ID",),
    "rank": ("RANK",),
    "world_size": ("WORLD_SIZE",),
    "local_world_size": ("LOCAL_WORLD_SIZE",),
    "master_addr": ("MASTER_ADDR",),
    "master_port": ("MASTER_PORT",),
}

# Every variable torchrun's agent sets for its workers, besides torch's own RANK, WORLD_SIZE etc.
ENV_PREFIXES = ("TORCHELASTIC_",)


def detect(env: Mapping[str, str]) -> bool:
    return bool(env.get(VARIABLES["run_id"][0]))


@dataclass(frozen=True)
class TorchrunEnv:
    """What torchrun told this worker, as written (only shown and counted, never checked)."""

    run_id: str
    rank: str
    world_size: str
    local_world_size: str
    master_addr: str | None
    master_port: str | None

    @property
    def nodes(self) -> int:
        world, local = self.world_size, self.local_world_size
        nodes = int(world) // max(1, int(local)) if is_digits(world) and is_digits(local) else 1
        return max(1, nodes)


def parse(env: Mapping[str, str], accelerator: object) -> TorchrunEnv:
    """accelerator: unused (a torchrun worker launches nothing on the GPUs itself)."""
    return TorchrunEnv(
        run_id=env.get("TORCHELASTIC_RUN_ID", ""),
        rank=env.get("RANK", "?"),
        world_size=env.get("WORLD_SIZE", "?"),
        local_world_size=env.get("LOCAL_WORLD_SIZE", "1"),
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=env.get("MASTER_PORT") or None,
    )


def identity(job: TorchrunEnv, facts: NodeFacts) -> JobIdentity:
    """None of its own: the launch that started torchrun exported the job's (DDP_JOB_ID, DDP_NODE_NAME)."""
    return NO_IDENTITY


def questions(job: TorchrunEnv, options: LaunchOptions) -> ProbeQuestions:
    """Nothing to look up (torchrun already found the master) and no GPUs to check (its agent did)."""
    return ProbeQuestions()


def plan(job: TorchrunEnv, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    notes = [f"inside torchrun (TORCHELASTIC_RUN_ID={job.run_id}, RANK={job.rank}, "
             f"WORLD_SIZE={job.world_size}): running the workload directly"]
    ignored = [flag for flag, value in (("--nproc-per-node", options.nproc_per_node),
                                        ("--rdzv-host", options.rdzv_host),
                                        ("--rdzv-port", options.rdzv_port),
                                        ("--log-dir", options.log_dir)) if value is not None]
    if ignored:
        notes.append(f"ignored inside torchrun: {', '.join(ignored)}")
    port = job.master_port.strip() if job.master_port else ""
    rendezvous = None if job.master_addr is None else Endpoint(
        job.master_addr, int(port) if is_digits(port) else None, ipv4_literal(job.master_addr))
    # No Flight Recorder settings: the workload runs as the torchrun we did not start set it up.
    return LaunchPlan("torchrun", options.workload.direct_argv(facts.python), (), tuple(notes),
                      job.nodes, rendezvous)
