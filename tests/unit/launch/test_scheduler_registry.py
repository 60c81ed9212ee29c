"""The schedulers are a registry: every module of ddp_launch/schedulers/ (but its libraries) is one, of
the shape schedulers.Scheduler states, tried in the order of its DETECTION_PLACE. A throwaway
scheduler written in tmp_path, as a contributor would add PBS, is detected, listed in --help and
--mode, and planned, its identity exported, with no other file changed."""

from __future__ import annotations

import importlib
import sys
import typing

import pytest

import ddp_launch.schedulers
from ddp_launch import options, planner
from ddp_launch.schedulers import DETECTION_ORDER, Scheduler, registered, scheduler_for
from launch_envs import env_of, plan_for


@pytest.mark.parametrize("scheduler", DETECTION_ORDER, ids=lambda module: module.__name__)
def test_every_shipped_scheduler_has_the_whole_protocol(scheduler):
    assert isinstance(scheduler, Scheduler)
    members = set(typing.get_type_hints(Scheduler)) | {"detect", "parse", "questions", "plan", "identity"}
    assert {member for member in members if not hasattr(scheduler, member)} == set()


def test_the_planner_holds_its_scheduler_as_the_protocol():
    assert typing.get_type_hints(planner.Launch)["scheduler"] is Scheduler


def test_the_registry_is_the_package_in_detection_order_without_its_libraries():
    assert [module.__name__.rsplit(".", 1)[1] for module in registered()] == ["torchrun", "slurm", "kubeflow", "local"]
    places = [module.DETECTION_PLACE for module in registered()]
    assert places == sorted(places) and len(set(places)) == len(places)


# -- a scheduler registered from tmp_path: PBS, as a contributor would add it --------------------------

# PBS Professional sets PBS_JOBID ("the job identifier assigned to the job by the batch system") in
# every job's environment (Altair PBS Professional Reference Guide, "PBS Environment Variables").
PBS_MODULE = '''
"""PBS: a two-node PBS job (a scheduler that ships with no file of the repository; its launch is not the point)."""
from dataclasses import dataclass

from ddp_launch.job_identity import JobIdentity
from ddp_launch.gpus import GrantVariables
from ddp_launch.facts import ProbeQuestions
from ddp_launch.plan import LaunchPlan
from ddp_launch.torchrun_command import torchrun_command

DETECTION_PLACE = 25
MODES = {"pbs": "PBS_JOBID set: torchrun on this PBS node"}
VARIABLES = {"job_id": ("PBS_JOBID",)}
ENV_PREFIXES = ("PBS_",)
HELP = "rendezvous on PBS: the first host of PBS_NODEFILE"
GPU_GRANT = GrantVariables()
NODE_NAME = ()


def detect(env):
    return bool(env.get("PBS_JOBID"))


@dataclass(frozen=True)
class PbsJob:
    job_id: str


def parse(env, accelerator):
    return PbsJob(env["PBS_JOBID"])


def identity(job, facts):
    return JobIdentity(job.job_id, "PBS_JOBID", "pbs-node-1", "the test", file_name=job.job_id)


def questions(job, options):
    return ProbeQuestions()


def plan(job, options, env, facts):
    argv = torchrun_command(facts.python, "2", 1, None, 0, None, options.workload)
    return LaunchPlan("pbs", argv, (), (f"PBS job {job.job_id}",), nodes=2)
'''
PBS_JOB = {"PBS_JOBID": "4242.pbs-server"}


@pytest.fixture
def pbs(tmp_path, monkeypatch):
    """The module written in tmp_path, and tmp_path put on the package's path: what adding a file there does."""
    (tmp_path / "pbs.py").write_text(PBS_MODULE)
    monkeypatch.setattr(ddp_launch.schedulers, "__path__", [*ddp_launch.schedulers.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "ddp_launch.schedulers.pbs", raising=False)
    importlib.invalidate_caches()
    yield
    sys.modules.pop("ddp_launch.schedulers.pbs", None)


def test_a_registered_scheduler_is_detected_in_its_place_and_listed_in_the_help(pbs):
    names = [module.__name__.rsplit(".", 1)[1] for module in registered()]
    assert names == ["torchrun", "slurm", "pbs", "kubeflow", "local"]
    assert isinstance(registered()[2], Scheduler)
    assert scheduler_for("auto", PBS_JOB).__name__ == "ddp_launch.schedulers.pbs"
    assert scheduler_for("auto", {**PBS_JOB, "SLURM_JOB_ID": "1"}).__name__ == "ddp_launch.schedulers.slurm"
    assert options.read_options(["--mode", "pbs"], {}).mode == "pbs"
    help_text = options.build_parser().format_help()
    assert "  pbs         PBS_JOBID set: torchrun on this PBS node" in help_text
    assert "rendezvous on PBS: the first host of PBS_NODEFILE" in help_text


def test_a_registered_scheduler_plans_and_its_identity_reaches_the_trainer(pbs):
    plan = plan_for(PBS_JOB, "--dry-run")
    env = env_of(plan)
    assert plan.mode == "pbs" and "PBS job 4242.pbs-server" in plan.notes
    assert env["DDP_JOB_ID"] == "4242.pbs-server" and env["DDP_NODE_NAME"] == "pbs-node-1"
    reasons = {change.name: change.reason for change in plan.changes}
    assert "from PBS_JOBID" in reasons["DDP_JOB_ID"]
    # The fabric's plan names NCCL's log after the job, as the scheduler's identity says.
    fabric = {change.name: change.value for change in plan.changes}
    assert fabric["NCCL_DEBUG_FILE"].endswith("/nccl-4242.pbs-server.%h.%p.log")
