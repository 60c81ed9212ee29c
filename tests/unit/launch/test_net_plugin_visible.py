"""The plan requires NCCL's OFI plugin on Slingshot (NCCL_NET='AWS Libfabric'): it refuses, in one
line naming the binds command, when that plugin cannot be loaded in this container.

NCCL dlopens libnccl-net.so for its net plugin (NCCL ext-net/README.md, "Plugin name and
supporting multiple plugins"), and dlopen finds it only on LD_LIBRARY_PATH or in the loader's
own directories (ld.so(8), https://man7.org/linux/man-pages/man8/ld.so.8.html). With NCCL_NET
set and no plugin, NCCL fails at the first collective ("NCCL_NET ... not found"), on every rank.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from launch_envs import HOSTS, olivia

from ddp_launch import planner
from ddp_launch.errors import LaunchError
from ddp_launch.fabric.defaults import read_fabric_data
from ddp_launch.facts import Resolved
from ddp_launch.options import read_options

ARGV = ["--site", "olivia"]


def node_tree(root: Path, plugin_at: str | None = None, ld_conf: str | None = None) -> Path:
    """An Olivia GH200 node as the container sees it: CXI devices, hsn interfaces."""
    for index in range(4):
        (root / "dev").mkdir(parents=True, exist_ok=True)
        (root / "dev" / f"cxi{index}").touch()
        (root / "sys/class/net" / f"hsn{index}").mkdir(parents=True, exist_ok=True)
    if plugin_at is not None:
        (root / plugin_at.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / plugin_at.lstrip("/") / "libnccl-net.so").write_bytes(b"\x7fELF")
    if ld_conf is not None:
        (root / "etc/ld.so.conf.d").mkdir(parents=True)
        (root / "etc/ld.so.conf.d/ofi.conf").write_text(ld_conf)
    return root


def plan_on(root: Path, env: dict):
    """cli.launch's three steps on the fake node (the head's lookup answered from the fake table)."""
    launch = planner.parse(read_options(ARGV, env), env, read_fabric_data("olivia", env))
    questions = planner.questions(launch)
    facts = planner.probe(replace(questions, head=None), str(root))
    facts = replace(facts, head=Resolved(questions.head, HOSTS[questions.head.name]), machine="aarch64")
    return planner.plan(launch, facts)


def test_nothing_bound_is_refused_in_one_line_naming_the_binds_command(tmp_path):
    root = node_tree(tmp_path / "node")
    with pytest.raises(LaunchError) as error:
        plan_on(root, olivia(0))
    message = str(error.value)
    assert message.startswith("NCCL_NET='AWS Libfabric' needs NCCL's OFI plugin (libnccl-net.so)")
    assert 'export APPTAINER_BIND="$(python3 -m ddp_launch.binds --site olivia)"' in message
    assert "\n" not in message


def test_the_bound_host_plugin_is_found_where_the_site_puts_it(tmp_path):
    root = node_tree(tmp_path / "node", plugin_at="/opt/aws-ofi-nccl/lib")
    plan = plan_on(root, olivia(0))
    values = {c.name: c.value for c in plan.changes}
    assert values["NCCL_NET"] == "AWS Libfabric"
    assert values["LD_LIBRARY_PATH"].split(":")[0] == "/opt/aws-ofi-nccl/lib"


@pytest.mark.parametrize("plugin_at, ld_conf, env", [
    ("/usr/lib/aarch64-linux-gnu", None, {}),                        # a trusted directory
    ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib\n", {}),  # in ld.so.cache
    ("/my/plugin", None, {"LD_LIBRARY_PATH": "/my/plugin"}),           # the user's path
])
def test_a_plugin_the_loader_finds_by_itself_is_enough(tmp_path, plugin_at, ld_conf, env):
    root = node_tree(tmp_path / "node", plugin_at=plugin_at, ld_conf=ld_conf)
    values = {c.name: c.value for c in plan_on(root, {**olivia(0), **env}).changes}
    assert values["NCCL_NET"] == "AWS Libfabric"


def test_a_users_nccl_net_is_theirs(tmp_path):
    root = node_tree(tmp_path / "node")
    plan = plan_on(root, {**olivia(0), "NCCL_NET": "Socket"})
    assert "NCCL_NET" not in {c.name for c in plan.changes}


def test_one_node_needs_no_plugin(tmp_path):
    root = node_tree(tmp_path / "node")
    single = {**olivia(0), "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_NTASKS": "1",
              "SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_NODELIST": "olivia-gh001", "SLURM_STEP_NODELIST": "olivia-gh001",
              "SLURM_TASKS_PER_NODE": "1", "SLURM_STEP_TASKS_PER_NODE": "1"}
    assert "NCCL_NET" not in {c.name for c in plan_on(root, single).changes}


def test_through_ddp_launch_it_is_exit_2_and_one_line(tmp_path):
    # The real probe on this machine has no /dev/cxi*, so the refusal is driven through the same
    # edge with a fake root: errors.run_main turns the LaunchError into one line and 2.
    root = node_tree(tmp_path / "node")
    script = (
        "import sys; from dataclasses import replace\n"
        "from ddp_launch import planner, cli, gpus\n"
        "from ddp_launch.facts import Resolved\n"
        "gpus.probe_driver = lambda accelerator: None  # as on a GPU node\n"
        "real = planner.probe\n"
        "# The fake root, and a head that did not resolve here (not the name service).\n"
        f"planner.probe = lambda q, root='/': replace(real(replace(q, head=None), {str(root)!r}),\n"
        "                                             head=Resolved(q.head, None))\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    env = {**olivia(0), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(planner.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", script, *ARGV], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("ddp-launch: error: NCCL_NET='AWS Libfabric' needs NCCL's OFI plugin")
    assert len(done.stderr.strip().splitlines()) == 1
