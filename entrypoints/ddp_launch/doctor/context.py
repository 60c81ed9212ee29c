"""The doctor's one view of this node: the site, the fabric defaults, the GPU vendor's data and the
launcher's own probe and plan, read once into a DoctorContext that every check reads."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Mapping, Optional, Tuple

from ddp_contract.fabrics import AUTO
from ddp_launch import planner
from ddp_launch.accelerators import DEFAULT_ACCELERATOR, Accelerator, load_accelerator
from ddp_launch.doctor.probes import Probes
from ddp_launch.envvars import Setting
from ddp_launch.errors import LaunchError
from ddp_launch.fabric import FabricPlan, FabricRequest, directories_to_probe, plan_fabric
from ddp_launch.fabric.defaults import FabricData, read_all_fabric_defaults
from ddp_launch.fabric.registry import fabric_named
from ddp_launch.facts import NodeFacts
from ddp_launch.gpus import GrantVariables
from ddp_launch.launch_options import Workload
from ddp_launch.options import read_options
from ddp_launch.plan import LAUNCHER, LaunchPlan
from ddp_launch.schedulers import gpu_grants, node_name
from ddp_launch.sites import CONTAINER_RUNTIMES, SiteProfile

# Set by the job scripts (slurm/lib/ddp.sh): the command that runs the image, apptainer or singularity.
CONTAINER_RUNTIME_VAR = "DDP_CONTAINER_RUNTIME"


@dataclass(frozen=True)
class DoctorContext:
    env: Mapping[str, str]
    root: str
    offline: bool
    profile: Optional[SiteProfile]
    data_dir: str
    probes: Probes
    facts: NodeFacts                    # this node, read once by the launcher's own probe
    fabric: FabricPlan                  # what the launcher would set on this node, from the same code
    accelerator: Accelerator            # the site's GPU vendor (its device files, flag, driver, collective)
    data: FabricData                    # the site profile, every fabric's defaults and the vendor, read once
    launch: Optional[LaunchPlan] = None     # the launcher's plan; None when planning refused
    plan_problem: Optional[str] = None      # the launcher's one-line refusal, when it refused
    cpu_workers: Optional[Setting] = None   # CPU workers asked for (DDP_LAUNCH_CPU_WORKERS): GPUs unused on purpose
    workload: Workload = Workload()         # what the job runs: the built-in trainer, or the user's script or module
    # Every scheduler's GPU variables: the doctor judges this node's grant whoever scheduled it.
    gpu_grant: GrantVariables = field(default_factory=gpu_grants)
    known_issue_files: Tuple[str, ...] = ()  # --known-issues: rows of the user's beside the shipped ones

    @property
    def multi_node(self) -> bool:
        return self.launch is not None and self.launch.nodes > 1

    @property
    def node(self) -> str:
        """This node's name as the job's files and its scheduler name it (doctor-%N.json, --exclude), else its
        hostname."""
        return node_name(self.env) or self.facts.hostname or "this node"


def launcher_argv(profile: Optional[SiteProfile], workload: Workload = Workload()) -> Tuple[str, ...]:
    """What the doctor asks the planner: a dry run (no waiting for a pod's DNS) with the site and the workload."""
    named = () if workload == Workload() else tuple(workload.describe().split(" ", 1))
    return ("--dry-run",) + (("--site", profile.name) if profile else ()) + named


def make_context(env, root, offline, profile, data_dir, probes, workload: Workload = Workload(),
                 known_issue_files=()) -> DoctorContext:
    """Probe and plan as `ddp-launch` would here; a refusal becomes ctx.plan_problem, not a crash."""
    argv = launcher_argv(profile, workload)
    accelerator = load_accelerator(profile.accelerator if profile else DEFAULT_ACCELERATOR, env)
    data = FabricData(profile, read_all_fabric_defaults(env), accelerator)
    launch, problem, cpu_workers = None, None, None
    try:
        options = read_options(argv, env)
        cpu_workers = options.cpu_workers
        parsed = planner.parse(options, env, data)
        # Without the driver question: check_gpus asks torch itself and says more than a refusal.
        questions = replace(planner.questions(parsed), cuda=False)
    except LaunchError as error:
        questions = planner.ProbeQuestions(directories=directories_to_probe(data), accelerator=accelerator)
        problem = str(error)
    facts = planner.probe(questions, root)
    if problem is None:
        try:
            launch = planner.plan(parsed, facts)
        except LaunchError as error:
            problem = str(error)
    if launch is not None and launch.fabric is not None:
        fabric = FabricPlan(launch.fabric, tuple(c for c in launch.changes if c.origin != LAUNCHER), launch.findings)
    else:
        # The planner refused before the fabric: the node's own fabric settings still get checked.
        fabric = plan_fabric(FabricRequest(env=env, multi_node=False, gpu_grant=gpu_grants()), facts, data)
    return DoctorContext(env, root, offline, profile, data_dir, probes, facts, fabric, accelerator, data, launch,
                         problem, cpu_workers, known_issue_files=tuple(known_issue_files), workload=workload)


def fabric_expected(ctx: DoctorContext) -> Optional[ModuleType]:
    """The high-speed fabric this node must have (fabric.common.Fabric): the site profile's, else the
    one the plan found; None where sockets are the fabric. A fabric that is NCCL's IB transport is not
    expected where the user turned that off with NCCL_IB_DISABLE=1 ("NCCL will fall back to using IP
    sockets", https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-disable), as the
    launcher plans it then (fabric.ethernet_requested); runai/submit.sh sets it for RUNAI_RDMA=0."""
    if ctx.profile and ctx.profile.fabric != AUTO and fabric_named(ctx.profile.fabric).HIGH_SPEED:
        expected = fabric_named(ctx.profile.fabric)
    else:
        planned = fabric_named(ctx.fabric.fabric)
        expected = planned if planned.HIGH_SPEED else None
    if expected is not None and expected.NCCL_IB_TRANSPORT and ctx.env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return None
    return expected


def container_runtime(ctx: DoctorContext) -> str:
    """The command the fixes name: DDP_CONTAINER_RUNTIME where the job script set it (slurm/lib/ddp.sh
    runs the image with it, and Apptainer and SingularityCE pass the host's environment in), else the
    site profile's (LUMI: singularity, its only runtime), else apptainer."""
    chosen = ctx.env.get(CONTAINER_RUNTIME_VAR, "")
    if chosen in CONTAINER_RUNTIMES:
        return chosen
    return ctx.profile.container_runtime if ctx.profile else CONTAINER_RUNTIMES[0]


def planned(ctx: DoctorContext, name: str) -> Optional[str]:
    """The value the launcher would run with: the user's, else the fabric plan's."""
    if name in ctx.env:
        return ctx.env[name]
    for change in ctx.fabric.changes:
        if change.name == name:
            return change.value
    return None


def library_dirs(ctx: DoctorContext) -> Tuple[str, ...]:
    """The workers' LD_LIBRARY_PATH: the launcher merges the site's directories into the
    user's (NGC images set one), so its planned change wins over the environment's value."""
    merged = next((c.value for c in ctx.fabric.changes if c.name == "LD_LIBRARY_PATH"), None)
    value = merged if merged is not None else ctx.env.get("LD_LIBRARY_PATH", "")
    return tuple(d for d in value.split(":") if d)
