"""SLURM: the reference setups (launch_envs.py) planned end to end from their environments."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ddp_launch.accelerators import load_accelerator
from ddp_launch.errors import LaunchError
from ddp_launch.facts import parse_routes
from ddp_launch.rendezvous import rendezvous_port
from ddp_launch.schedulers.slurm import auto_mode, parse, parse_tasks_per_node
from launch_envs import (PYTHON, RAVEN_STEP, env_of, fake_resolver, olivia, plan_for,
                         raven, six_node_ethernet)

OLIVIA_PORT = 20000 + 234 * 10 + 0  # job 771234, step 0


@pytest.mark.parametrize("value, expected", [
    ("4", (4,)), ("4(x2)", (4, 4)), ("3,2(x2)", (3, 2, 2)), ("2(x3),1", (2, 2, 2, 1)), ("1(x6)", (1,) * 6),
])
def test_tasks_per_node_forms(value, expected):
    assert parse_tasks_per_node(value) == expected


@pytest.mark.parametrize("value", ["4(x)", "x2", "4(2)", "", "3,,2", "4(x2"])
def test_bad_tasks_per_node_names_variable_value_and_form(value):
    with pytest.raises(LaunchError, match=r"SLURM_TASKS_PER_NODE=.*'4\(x2\)'"):
        parse_tasks_per_node(value)


# -- Olivia: one task per node, torchrun per node ------------------------------------------------

def test_olivia_head_node_runs_torchrun_hosting_the_c10d_store():
    plan = plan_for(olivia(0))
    assert plan.mode == "slurm-node"
    assert plan.argv == (
        PYTHON, "-m", "ddp_launch.agent", "--nnodes=2", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=10.10.0.1:{OLIVIA_PORT}", "--rdzv-id=771234.0",
        "--rdzv-conf=is_host=true,read_timeout=300", "--nproc-per-node=4", "--max-restarts=0",
        "-m", "ddp_launch.worker", "-m", "ddp_train")
    assert (plan.nodes, plan.rendezvous.host) == (2, "10.10.0.1")


def test_olivia_second_node_joins_without_hosting():
    plan = plan_for(olivia(1))
    assert "--rdzv-conf=is_host=false,read_timeout=300" in plan.argv
    assert f"--rdzv-endpoint=10.10.0.1:{OLIVIA_PORT}" in plan.argv


def test_every_node_of_a_step_computes_the_same_rendezvous():
    head, worker = plan_for(olivia(0)).argv, plan_for(olivia(1)).argv
    differing = [(a, b) for a, b in zip(head, worker) if a != b]
    assert differing == [("--rdzv-conf=is_host=true,read_timeout=300",
                          "--rdzv-conf=is_host=false,read_timeout=300")]


def test_auto_detects_slurm_node_for_one_task_per_node():
    assert auto_mode(parse(olivia(0), load_accelerator("nvidia", {}))) == "slurm-node"


def test_step_nodelist_wins_over_job_nodelist():
    env = {**olivia(0), "SLURM_JOB_NODELIST": "olivia-gh[000-003]", "SLURM_JOB_NUM_NODES": "4"}
    plan = plan_for(env)
    assert plan.rendezvous.host == "10.10.0.1" and "--nnodes=2" in plan.argv


def test_job_nodelist_is_the_fallback_without_step_variables():
    env = {k: v for k, v in olivia(0).items() if not k.startswith("SLURM_STEP_")}
    env["SLURM_STEP_ID"] = "0"
    plan = plan_for(env)
    assert "--nnodes=2" in plan.argv and f"--rdzv-endpoint=10.10.0.1:{OLIVIA_PORT}" in plan.argv


def test_unresolvable_head_is_passed_by_name_never_as_localhost():
    plan = plan_for(olivia(1), resolve=fake_resolver({}))
    assert f"--rdzv-endpoint=olivia-gh001:{OLIVIA_PORT}" in plan.argv
    assert any("did not resolve" in note for note in plan.notes)


def test_head_resolving_to_loopback_on_another_node_is_an_error():
    with pytest.raises(LaunchError, match=r"olivia-gh001.*127\.0\.1\.1.*--rdzv-host"):
        plan_for(olivia(1), resolve=fake_resolver({"olivia-gh001": "127.0.1.1"}))


def test_head_resolving_to_loopback_on_itself_passes_the_name():
    plan = plan_for(olivia(0), resolve=fake_resolver({"olivia-gh001": "127.0.1.1"}))
    assert f"--rdzv-endpoint=olivia-gh001:{OLIVIA_PORT}" in plan.argv


# The Ethernet cluster's layout: each node has a default-route eno1 (10.0.0.0/24, gateway
# 10.0.0.1) and the cluster network on ens1f1 (192.168.20.0/24), where the names resolve; on
# the head, Debian's /etc/hosts puts its own name on 127.0.1.1 (Debian Reference, "The
# hostname resolution"). /proc/net/route prints addresses as little-endian hex.
DUAL_HOMED_ROUTES = parse_routes(
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eno1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    "eno1\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
    "ens1f1\t0014A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")


def test_every_node_of_a_dual_homed_ethernet_cluster_talks_on_the_cluster_network():
    on_the_head = fake_resolver({"master-node": "127.0.1.1", "node01": "192.168.20.16"})
    head = plan_for(six_node_ethernet(0), resolve=on_the_head, routes=DUAL_HOMED_ROUTES)
    other = plan_for(six_node_ethernet(3), routes=DUAL_HOMED_ROUTES)
    chosen = [{c.name: c.value for c in plan.changes}["NCCL_SOCKET_IFNAME"] for plan in (head, other)]
    assert chosen == ["ens1f1", "ens1f1"]


def test_rdzv_flags_beat_env_overrides_which_beat_derived_values():
    env = {**olivia(1), "DDP_LAUNCH_RDZV_HOST": "10.0.0.99", "DDP_LAUNCH_RDZV_PORT": "24000"}
    assert "--rdzv-endpoint=10.0.0.99:24000" in plan_for(env).argv
    flags = plan_for(env, "--rdzv-host", "10.0.0.7", "--rdzv-port", "25000").argv
    assert "--rdzv-endpoint=10.0.0.7:25000" in flags


def test_localhost_override_on_a_multi_node_job_is_an_error():
    with pytest.raises(LaunchError, match="DDP_LAUNCH_RDZV_HOST='localhost'.*itself"):
        plan_for({**olivia(1), "DDP_LAUNCH_RDZV_HOST": "localhost"})


def test_nproc_and_restarts_flags_reach_torchrun():
    plan = plan_for(olivia(0), "--nproc-per-node", "2", "--max-restarts", "3")
    assert {"--nproc-per-node=2", "--max-restarts=3"} <= set(plan.argv)


def test_log_dir_is_per_node_and_every_worker_stream_is_teed_with_host_and_rank():
    plan = plan_for(olivia(0), "--log-dir", "/tmp/l/")
    head, other = plan.argv, plan_for(olivia(1), "--log-dir", "/tmp/l/").argv
    assert "--log-dir=/tmp/l/olivia-gh001" in head and "--log-dir=/tmp/l/olivia-gh002" in other
    assert "--tee=3" in head
    assert head.index("--tee=3") < head.index("-m", 3)  # a torchrun flag, not the workload's
    # The prefix goes by torchrun's variable: its --log-line-prefix-template flag is new in
    # torch 2.14, and older torch (NGC images) would take it for the script.
    assert not any(a.startswith("--log-line-prefix") for a in head)
    # The node's name is filled in here: torchrun before 2.14 knows no ${hostname}.
    assert {c.name: c.value for c in plan.changes}["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == \
        "olivia-gh001:rank${rank}: "


def test_without_log_dir_torchrun_leaves_worker_output_alone():
    plan = plan_for(olivia(0))
    assert not any(a.startswith(("--log-dir", "--tee", "--log-line-prefix")) for a in plan.argv)
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" not in {c.name for c in plan.changes}


def test_rendezvous_timeout_reaches_torchruns_join_timeout_from_flag_or_environment():
    conf = "--rdzv-conf=is_host=true,read_timeout=22,join_timeout=45"
    assert conf in plan_for(olivia(0), "--rdzv-timeout", "45").argv
    assert conf in plan_for({**olivia(0), "DDP_LAUNCH_RDZV_TIMEOUT": "45"}).argv


def test_restarts_give_each_round_its_own_store_so_restarted_workers_find_live_peers():
    plan = plan_for(olivia(0), "--max-restarts", "1")
    assert env_of(plan)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_no_restarts_keep_torchruns_shared_store_and_a_user_setting_wins():
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env_of(plan_for(olivia(0)))
    user = {**olivia(0), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env_of(plan_for(user, "--max-restarts", "2"))


def test_cpu_workers_hide_gpus_and_set_the_worker_count():
    plan = plan_for(olivia(0), "--cpu-workers", "2")
    assert "--nproc-per-node=2" in plan.argv
    assert env_of(plan)["CUDA_VISIBLE_DEVICES"] == ""
    assert env_of(plan)["OMP_NUM_THREADS"] == "36"  # 72 CPUs / 2 workers


def test_user_omp_num_threads_is_left_alone():
    plan = plan_for({**olivia(0), "OMP_NUM_THREADS": "8"})
    assert "OMP_NUM_THREADS" not in env_of(plan)


def test_no_gpu_anywhere_means_one_cpu_worker():
    env = {k: v for k, v in olivia(0).items() if "GPUS" not in k}
    plan = plan_for(env)
    assert "--nproc-per-node=1" in plan.argv
    assert any("no GPU found" in note for note in plan.notes)


def test_nodes_flag_matching_the_scheduler_is_accepted():
    assert plan_for(olivia(0), "--nodes", "2").mode == "slurm-node"


def test_nodes_flag_disagreeing_with_the_scheduler_names_both_numbers():
    with pytest.raises(LaunchError, match=r"--nodes 4 but SLURM gave this step 2 node"):
        plan_for(olivia(0), "--nodes", "4")


def test_batch_script_of_a_multi_node_job_is_refused():
    env = {k: v for k, v in olivia(0).items() if not k.startswith("SLURM_STEP")}
    with pytest.raises(LaunchError, match="batch script of a 2-node job.*srun"):
        plan_for(env)


def test_forcing_slurm_node_with_several_tasks_per_node_is_an_error():
    with pytest.raises(LaunchError, match="one task per node.*4\\(x2\\)"):
        plan_for(raven(0), "--mode", "slurm-node")


def test_unknown_node_index_on_a_multi_node_step_is_an_error():
    env = {k: v for k, v in olivia(1).items() if k not in ("SLURM_NODEID", "SLURMD_NODENAME")}
    with pytest.raises(LaunchError, match="SLURM_NODEID and SLURMD_NODENAME"):
        plan_for(env)


def test_node_name_identifies_the_head_when_node_id_is_missing():
    env = {k: v for k, v in olivia(0).items() if k != "SLURM_NODEID"}
    assert "--rdzv-conf=is_host=true,read_timeout=300" in plan_for(env).argv


# -- partial and inconsistent environments --------------------------------------------------------

def test_job_id_without_any_nodelist_is_an_error():
    with pytest.raises(LaunchError, match="SLURM_JOB_ID=42 is set but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"):
        plan_for({"SLURM_JOB_ID": "42"})


def test_non_integer_job_id_is_an_error():
    with pytest.raises(LaunchError, match="SLURM_JOB_ID='abc'"):
        plan_for({**olivia(0), "SLURM_JOB_ID": "abc"})


def test_node_count_disagreeing_with_nodelist_is_an_error():
    with pytest.raises(LaunchError, match="SLURM_STEP_NUM_NODES=3 but SLURM_STEP_NODELIST"):
        plan_for({**olivia(0), "SLURM_STEP_NUM_NODES": "3"})


def test_malformed_nodelist_reaches_the_user_with_its_variable():
    with pytest.raises(LaunchError, match=r"SLURM_STEP_NODELIST='olivia-gh\[001-'"):
        plan_for({**olivia(0), "SLURM_STEP_NODELIST": "olivia-gh[001-"})


def test_tasks_per_node_list_of_the_wrong_length_is_an_error():
    with pytest.raises(LaunchError, match="SLURM_STEP_TASKS_PER_NODE='1\\(x3\\)' lists 3"):
        plan_for({**olivia(0), "SLURM_STEP_TASKS_PER_NODE": "1(x3)"})


# -- the port ----------------------------------------------------------------------------------

def test_port_formula_and_range():
    assert rendezvous_port(771234, 0) == 22340
    assert rendezvous_port(999, 9) == 29999
    assert all(20000 <= rendezvous_port(job, step) <= 29999 for job in range(0, 5000, 7) for step in range(12))


def test_nearby_jobs_and_steps_of_one_job_get_different_ports():
    ports = {rendezvous_port(job, step) for job in range(5000, 6000) for step in range(10)}
    assert len(ports) == 10000


# -- Raven: one task per GPU, no torchrun ---------------------------------------------------------

def test_raven_task_execs_the_trainer_with_env_init_variables():
    plan = plan_for(raven(5), "--", "--epochs", "3")
    assert plan.mode == "slurm-task"
    assert plan.argv == (PYTHON, "-m", "ddp_launch.worker", "-m", "ddp_train", "--epochs", "3")
    env = env_of(plan)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.20.0.123", "MASTER_PORT": str(rendezvous_port(5550017, 0))}
    assert env["OMP_NUM_THREADS"] == "18"  # SLURM_CPUS_PER_TASK
    assert plan.nodes == 2


# The job scripts that run one task per GPU (ddp::run_job task): no torchrun there.
TASK_SCRIPTS = sorted(path.name for path in (Path(__file__).resolve().parents[3] / "slurm").glob("*.sh")
                      if re.search(r"^ddp::run_job task\b", path.read_text(), re.M))


@pytest.mark.parametrize("script", TASK_SCRIPTS)
def test_the_launcher_flags_a_task_per_gpu_script_suggests_are_ones_its_mode_uses(script):
    text = (Path(__file__).resolve().parents[3] / "slurm" / script).read_text()
    suggested = re.findall(r'DDP_LAUNCH_ARGS="([^"]+)"', text)
    assert suggested, f"{script} suggests no DDP_LAUNCH_ARGS"
    plain = plan_for(raven(5))
    for words in suggested:
        plan = plan_for(raven(5), *shlex.split(words))
        assert plan.mode == "slurm-task"
        assert not [note for note in plan.notes if "ignored" in note], (words, plan.notes)
        assert plan.changes != plain.changes, f"{words} changes nothing in slurm-task mode"


def test_max_restarts_in_task_mode_says_what_happens_instead():
    notes = plan_for(raven(5), "--max-restarts", "2").notes
    assert ("--max-restarts is ignored in slurm-task mode (no torchrun restarts the tasks): a crash ends the step, "
            "and a new run on the same --run-dir resumes from its checkpoint") in notes


def test_auto_detects_slurm_task_for_several_tasks_per_node():
    assert auto_mode(parse(raven(0), load_accelerator("nvidia", {}))) == "slurm-task"


def test_a_task_bound_to_one_gpu_keeps_torchs_local_rank_and_names_the_gpu_it_sees():
    # srun --ntasks-per-node=4 --gpus-per-task=1: task 5 is task 1 of node 1 (SLURM_LOCALID=1) and
    # sees only its own GPU. torch defines LOCAL_RANK as the worker's index on its node and
    # LOCAL_WORLD_SIZE as the workers there (https://docs.pytorch.org/docs/stable/elastic/run.html,
    # "Environment Variables"): 1 and 4. Its GPU is device 0 of the one it sees.
    plan = plan_for(raven(5, CUDA_VISIBLE_DEVICES="1"))
    env = env_of(plan)
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["DDP_TASK_DEVICE"]) == ("5", "1", "4", "0")
    reason = next(c.reason for c in plan.changes if c.name == "DDP_TASK_DEVICE")
    assert reason == "task 1 sees one GPU, its own (CUDA_VISIBLE_DEVICES=1): device 0 of those it sees, not its LOCAL_RANK"


def test_task_seeing_all_gpus_uses_its_local_id():
    env = env_of(plan_for(raven(6, CUDA_VISIBLE_DEVICES="0,1,2,3")))
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "4")
    assert "DDP_TASK_DEVICE" not in env


def test_fewer_visible_gpus_than_tasks_is_an_error():
    with pytest.raises(LaunchError, match="4 tasks on this node but CUDA_VISIBLE_DEVICES='0,1' lists 2"):
        plan_for(raven(1, CUDA_VISIBLE_DEVICES="0,1"))


def test_uneven_layout_gives_each_node_its_own_local_world():
    uneven = {**RAVEN_STEP, "SLURM_STEP_TASKS_PER_NODE": "3,2", "SLURM_TASKS_PER_NODE": "3,2",
              "SLURM_STEP_NUM_TASKS": "5", "SLURM_NTASKS": "5"}
    uneven.pop("SLURM_NTASKS_PER_NODE")
    second_node = {**uneven, "SLURM_PROCID": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}
    env = env_of(plan_for(second_node))
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("4", "5", "1", "2")


def test_uneven_layout_picks_task_mode_even_on_a_node_with_one_task():
    layout = {**RAVEN_STEP, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_STEP_NUM_TASKS": "4",
              "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "3,1"}
    layout.pop("SLURM_NTASKS_PER_NODE")
    single = {**layout, "SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}
    assert plan_for(single).mode == "slurm-task"


def test_step_tasks_per_node_win_over_the_jobs():
    env = {**raven(1), "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_TASKS": "4",
           "SLURM_NTASKS": "4"}
    assert env_of(plan_for(env))["LOCAL_WORLD_SIZE"] == "2"


def test_slurm_task_without_procid_is_an_error():
    env = {k: v for k, v in raven(0).items() if k != "SLURM_PROCID"}
    with pytest.raises(LaunchError, match="SLURM_PROCID is not set"):
        plan_for(env)


def test_cpu_workers_conflict_with_slurm_task_mode():
    with pytest.raises(LaunchError, match="conflict with --mode slurm-task"):
        plan_for(raven(0), "--cpu-workers", "2")


def test_script_workload_in_task_mode():
    plan = plan_for(raven(0), "--script", "train.py", "--", "--lr", "0.1")
    assert plan.argv == (PYTHON, "-m", "ddp_launch.worker", "train.py", "--lr", "0.1")


# -- plain Ethernet: six nodes with one GPU each ----------------------------------------------------

def test_six_node_ethernet_runs_one_single_gpu_torchrun_per_node():
    plan = plan_for(six_node_ethernet(3))
    assert plan.mode == "slurm-node"
    assert {"--nnodes=6", "--nproc-per-node=1", "--rdzv-endpoint=192.168.20.15:29080",
            "--rdzv-conf=is_host=false,read_timeout=300"} <= set(plan.argv)
    assert plan.nodes == 6


def test_six_node_ethernet_forced_task_mode_ranks_by_slurm_procid():
    env = env_of(plan_for(six_node_ethernet(4), "--mode", "slurm-task"))
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == ("4", "6", "0", "192.168.20.15")
