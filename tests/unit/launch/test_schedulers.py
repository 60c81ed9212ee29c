"""One shape for every scheduler, one detection order, and a plan that reads nothing but its arguments."""

from __future__ import annotations

import builtins
import contextlib
import inspect
import os
import socket
from unittest import mock

import pytest

from ddp_launch import gpus, options, planner
from ddp_launch.accelerators import load_accelerator
from ddp_launch.envvars import Setting, first_set, integer, port
from ddp_launch.errors import LaunchError
from ddp_launch.facts import Route, NodeFacts
from ddp_launch.planner import ProbeQuestions
from ddp_launch.rendezvous import Head
from ddp_launch.schedulers import DETECTION_ORDER, kubeflow, local, scheduler_for, slurm, torchrun
from launch_envs import (PYTHON, facts_for, kubeflow_v1, launch_of, olivia, plan_for, questions_for, raven, runai,
                         six_node_ethernet, trainer_v2)

SHAPE = {"detect": ["env"], "parse": ["env", "accelerator"], "questions": ["job", "options"],
         "plan": ["job", "options", "env", "facts"]}


@pytest.mark.parametrize("scheduler", DETECTION_ORDER, ids=lambda module: module.__name__)
def test_every_scheduler_module_has_the_same_shape(scheduler):
    for name, parameters in SHAPE.items():
        assert list(inspect.signature(getattr(scheduler, name)).parameters) == parameters, name
    assert scheduler.MODES and all(isinstance(mode, str) and isinstance(line, str) and line
                                   for mode, line in scheduler.MODES.items())
    tables = [scheduler.VARIABLES]
    while tables:  # slurm's table holds its three scopes
        for names in tables.pop().values():
            if isinstance(names, dict):
                tables.append(names)
            else:
                assert names and all(name.isupper() for name in names), names


def test_the_mode_flag_accepts_exactly_the_modes_the_schedulers_plan():
    planned = [mode for scheduler in DETECTION_ORDER for mode in scheduler.MODES]
    assert len(planned) == len(set(planned))  # one module per mode
    assert all(mode in scheduler_for(mode, {}).MODES for mode in planned)
    for mode in ["auto", *planned]:
        assert options.read_options(["--mode", mode], {}).mode == mode
    with pytest.raises(LaunchError, match="'slurm' is not a mode: choose one of auto, torchrun, slurm-task"):
        options.read_options(["--mode", "slurm"], {})


def test_the_help_lists_every_mode_in_detection_order_in_its_modules_own_words():
    help_text = options.build_parser().format_help()
    listed = help_text[help_text.index("modes (auto detection"):help_text.index("precedence:")]
    at = [listed.index(f"  {mode} ") for scheduler in DETECTION_ORDER for mode in scheduler.MODES]
    assert at == sorted(at)
    for scheduler in DETECTION_ORDER:
        for line in "\n".join(scheduler.MODES.values()).splitlines():
            assert line in listed


def test_detection_tries_torchrun_slurm_kubeflow_then_local_which_takes_anything():
    assert DETECTION_ORDER == (torchrun, slurm, kubeflow, local)
    everything = {**olivia(0), **runai(0), "TORCHELASTIC_RUN_ID": "r"}
    assert scheduler_for("auto", everything) is torchrun
    assert scheduler_for("auto", {**olivia(0), **runai(0)}) is slurm
    assert scheduler_for("auto", runai(0)) is kubeflow
    assert scheduler_for("auto", {}) is local and local.detect({})


def test_slurm_decides_its_node_or_task_split_itself_and_a_forced_mode_wins():
    assert plan_for(olivia(0)).mode == "slurm-node" and plan_for(raven(5)).mode == "slurm-task"
    assert plan_for(six_node_ethernet(3), "--mode", "slurm-task").mode == "slurm-task"


# -- the plan is pure -----------------------------------------------------------------------

SEEDS = {
    "olivia head": (olivia(0), ()),
    "olivia worker": (olivia(1), ("--log-dir", "/logs", "--max-restarts", "1")),
    "raven task": (raven(5), ()),
    "runai pod": (runai(1), ()),
    "kubeflow v1 pod": (kubeflow_v1(1), ()),
    "trainer v2 pod": (trainer_v2(0), ("--nccl-debug", "INFO")),
    "inside torchrun": ({"TORCHELASTIC_RUN_ID": "r", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, ()),
    "local": ({}, ("--cpu-workers", "2", "--script", "train.py")),
}


NODE_READS = ((socket, "getaddrinfo"), (socket, "gethostbyname"), (os, "listdir"), (os, "scandir"),
              (os, "stat"), (os.path, "isfile"), (os.path, "isdir"), (os.path, "exists"),
              (gpus, "probe_driver"), (builtins, "open"))


@pytest.mark.parametrize("case", sorted(SEEDS))
def test_questions_and_plan_read_no_file_and_not_the_name_service(case):
    """Not the node, and not the data files either: cli read those (read_fabric_data) before."""
    env, argv = SEEDS[case]
    expected = plan_for(env, *argv)  # imports everything once, before the node is off limits
    facts = facts_for(env, *argv)
    launch = launch_of(env, *argv)
    touched = []

    def guard(name):
        def read(*args, **kwargs):
            path = str(args[0]) if args and isinstance(args[0], (str, os.PathLike)) else ""
            touched.append(f"{name}({path})")
            raise OSError(f"{name}: the plan must not read the node")
        return read

    # Patched only around the two calls: pytest itself needs os.stat to report a failure.
    with contextlib.ExitStack() as patches:
        for module, name in NODE_READS:
            patches.enter_context(mock.patch.object(module, name, guard(name)))
        try:
            planned, asked = planner.plan(launch, facts), planner.questions(launch)
        except Exception as error:  # noqa: BLE001 (reported below, once the patches are gone)
            planned = asked = error
    assert touched == []
    assert planned == expected and isinstance(asked, ProbeQuestions)


def test_the_rendezvous_comes_from_the_facts_lookup_not_a_resolver():
    facts = facts_for(olivia(1), resolve=lambda host: "10.10.9.9")
    assert facts.head.name == "olivia-gh001"
    plan = planner.plan(launch_of(olivia(1)), facts)
    assert (plan.nodes, plan.rendezvous.host, plan.rendezvous.port) == (2, "10.10.9.9", 22340)


def test_a_plan_without_the_script_on_this_node_names_the_working_directory():
    facts = NodeFacts(python=PYTHON, cwd="/home/me/job")
    with pytest.raises(LaunchError, match=r"--script 'train.py' is not a file.*taken from /home/me/job"):
        planner.plan(launch_of({}, "--script", "train.py"), facts)


def test_granted_gpus_the_driver_cannot_use_stop_the_plan():
    env = {**olivia(0), "SLURM_GPUS_ON_NODE": "4"}
    with pytest.raises(LaunchError, match=r"SLURM_GPUS_ON_NODE=4 granted 4 GPU\(s\).*\(cuInit failed\)"):
        plan_for(env, cuda_problem="cuInit failed")
    assert plan_for(env, "--cpu-workers", "2", cuda_problem="cuInit failed").mode == "slurm-node"


def test_inside_torchrun_the_rendezvous_is_torchruns_master():
    env = {"TORCHELASTIC_RUN_ID": "r", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400",
           "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    plan = plan_for(env)
    assert (plan.nodes, plan.rendezvous.host, plan.rendezvous.port) == (2, "10.0.0.5", 29400)
    assert plan_for({"TORCHELASTIC_RUN_ID": "r"}).rendezvous is None


# -- the questions ------------------------------------------------------------------------------

def test_slurm_asks_for_the_first_node_unless_the_rendezvous_host_is_given():
    assert questions_for(olivia(1)).head.name == "olivia-gh001"
    assert questions_for(olivia(1), "--rdzv-host", "olivia-gh002").head.name == "olivia-gh002"


def test_a_named_rdzv_host_on_ethernet_picks_the_interface_that_routes_to_it():
    # A default route on eth0 and 10.10.0.0/16 (where olivia-gh002 is) on its own interface.
    routes = (Route("eth0", 0, 0, 100), Route("hsn-free0", 0x0A0A0000, 0xFFFF0000, 0))
    plan = plan_for(olivia(1), "--rdzv-host", "olivia-gh002", routes=routes)
    assert plan.rendezvous.host == "olivia-gh002"  # torchrun gets the name as given
    assert ("NCCL_SOCKET_IFNAME", "hsn-free0") in [(c.name, c.value) for c in plan.changes]


def test_a_name_no_resolver_takes_is_not_looked_up_and_the_plan_refuses_it():
    env = {**olivia(1), "SLURM_STEP_NODELIST": "a..b,olivia-gh002", "SLURM_JOB_NODELIST": "a..b,olivia-gh002"}
    asked = questions_for(env).head
    assert asked.problem is not None and facts_for(env).head.address is None  # never looked up
    with pytest.raises(LaunchError, match="the first host of SLURM_STEP_NODELIST='a..b' is not a valid host"):
        plan_for(env)


def test_the_cuda_driver_is_asked_only_when_gpus_were_granted_for_gpu_workers():
    gpu_step = {**olivia(0), "SLURM_GPUS_ON_NODE": "4"}
    assert questions_for(gpu_step).cuda
    assert not questions_for(gpu_step, "--cpu-workers", "2").cuda
    assert not questions_for({"TORCHELASTIC_RUN_ID": "r", "CUDA_VISIBLE_DEVICES": "0"}).cuda
    assert not questions_for({}).cuda


def test_only_a_kubeflow_launch_waits_for_dns_and_not_on_a_dry_run():
    assert questions_for(trainer_v2(1)).dns_wait_s == 120.0
    assert questions_for(trainer_v2(1), "--dry-run").dns_wait_s is None
    assert questions_for({**trainer_v2(1), "DDP_LAUNCH_DNS_TIMEOUT": "7"}).dns_wait_s == 7.0
    assert questions_for(olivia(0)).dns_wait_s is None
    assert questions_for(trainer_v2(1)).head.name == "trainjob-node-0-0.trainjob"


def test_the_probe_answers_the_questions_under_a_root(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    (tmp_path / "opt" / "plugin").mkdir(parents=True)
    script = tmp_path / "train.py"
    script.touch()
    monkeypatch.setattr(gpus, "probe_driver", lambda accelerator: "no driver here")
    facts = planner.probe(ProbeQuestions(head=Head.named("10.1.2.3", "the test"), directories=("/opt/plugin", "/opt/none"),
                                         files=(str(script), "missing.py"), cuda=True,
                                         accelerator=load_accelerator("nvidia", {})), root=str(tmp_path))
    assert (facts.head.name, facts.head.address) == ("10.1.2.3", "10.1.2.3")
    assert facts.existing_dirs == {"/opt/plugin"} and facts.existing_files == {str(script)}
    assert (facts.gpu_device_files, facts.cuda_problem, facts.cwd) == (1, "no driver here", os.getcwd())


# -- the env-parsing module -------------------------------------------------------------------

def test_first_set_skips_blank_variables_and_names_the_one_it_used():
    env = {"SLURM_STEP_NUM_TASKS": "  ", "SLURM_NTASKS": " 8 "}
    assert first_set(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")) == Setting("8", "SLURM_NTASKS")
    assert first_set(env, ("SLURM_NPROCS",)) is None


@pytest.mark.parametrize("value", ["-1", "2.0", "٣", "²", "", "0x10"])
def test_integers_are_plain_ascii_digits_and_errors_name_the_variable(value):
    with pytest.raises(LaunchError, match=rf"^SLURM_NODEID={value!r} is not a non-negative integer: unset it"):
        integer("SLURM_NODEID", value)


def test_integer_bounds_and_ports():
    assert integer("X", " 7 ", 1) == 7
    with pytest.raises(LaunchError, match="X='0' is not a positive integer"):
        integer("X", "0", 1)
    assert port("MASTER_PORT", "65535") == 65535
    for bad in ("0", "65536"):
        with pytest.raises(LaunchError, match=f"MASTER_PORT='{bad}' is not a TCP port: give a number from 1"):
            port("MASTER_PORT", bad)


# -- one walk -----------------------------------------------------------------------------------

def test_the_planner_names_no_scheduler():
    """Adding a scheduler is adding a module: the planner only ever gets one from scheduler_for."""
    assert not [name for name, value in vars(planner).items() if value in DETECTION_ORDER]


def test_one_launch_parses_asks_and_plans_once_and_checks_the_head_name_once(monkeypatch, capsys):
    from ddp_launch import cli, rendezvous

    calls = []

    def counted(module, name):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(name) or real(*args, **kwargs))

    for name in ("parse", "questions", "plan"):
        counted(slurm, name)
    counted(rendezvous, "host_name_problem")
    # An address as the head: its lookup is its own answer, never the name service.
    with mock.patch.dict(os.environ, {**olivia(1), "DDP_LAUNCH_CPU_WORKERS": "1"}, clear=True):
        assert cli.main(["--dry-run", "--rdzv-host", "10.10.0.1"]) == 0
    assert sorted(calls) == ["host_name_problem", "parse", "plan", "questions"]
    assert "--rdzv-endpoint=10.10.0.1:22340" in capsys.readouterr().out
