"""Every field of a site profile with a value of the wrong type: one LaunchError naming the file
and the field, never a TypeError from deeper down; and the head-name lookups of the fabric."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from unittest import mock

import pytest

from ddp_launch import cli
from ddp_launch.errors import LaunchError
from ddp_launch.fabric import FabricRequest, plan_fabric
from ddp_launch.fabric.defaults import read_fabric_data
from ddp_launch.facts import NodeFacts, Resolved, parse_routes
from ddp_launch.rendezvous import Head
from ddp_launch.sites import parse_profile

SITES = Path(__file__).resolve().parents[3] / "containers" / "sites"
OLIVIA = json.loads((SITES / "olivia.json").read_text())
ENV_NAME = sorted(OLIVIA["env"])[0]

# (where, wrong value, what the error must name). `where` is a path into the document.
WRONG = [
    (("schema",), "1", "'schema' must be 1"), (("schema",), True, "'schema' must be 1"),
    (("schema",), 1.0, "'schema' must be 1"), (("schema",), [1], "'schema' must be 1"),
    (("name",), 5, "'name' must be"), (("name",), ["olivia"], "'name' must be"), (("name",), None, "'name' must be"),
    (("description",), 5, "'description' must be a string"), (("description",), ["x"], "'description' must be"),
    (("fabric",), 5, "'fabric' must be"), (("fabric",), ["slingshot"], "'fabric' must be"),
    (("fabric",), {}, "'fabric' must be"),
    (("gpu",), 5, "'gpu' must be a string"), (("gpu",), ["gh200"], "'gpu' must be"),
    (("accelerator",), 5, "'accelerator' must be one of nvidia, amd"), (("accelerator",), "intel", "'accelerator' must be one of"),
    (("accelerator",), ["amd"], "'accelerator' must be one of"), (("accelerator",), None, "'accelerator' must be one of"),
    (("binds",), {}, "'binds' must be a list"), (("binds",), "x", "'binds' must be a list"),
    (("binds",), None, "'binds' must be a list"),
    (("binds", 0), "x", "binds[0] must be an object"), (("binds", 0), 5, "binds[0] must be an object"),
    (("binds", 0, "name"), 5, "binds[0]: 'name' must be"), (("binds", 0, "name"), [], "binds[0]: 'name' must be"),
    (("binds", 0, "env"), ["X"], "'env' must be the name of a variable"),
    (("binds", 0, "env"), 5, "'env' must be the name of a variable"),
    (("binds", 0, "glob"), 5, "'glob' must be an absolute host path pattern"),
    (("binds", 0, "glob"), ["/opt/*"], "'glob' must be"),
    (("binds", 0, "target"), 5, "binds[0]: 'target' must be"),
    (("binds", 0, "required"), "yes", "'required' must be true or false"),
    (("binds", 0, "required"), 1, "'required' must be true or false"),
    (("binds", 0, "library_path"), "/lib", "'library_path' must be a list"),
    (("binds", 0, "library_path"), [5], "'library_path' must be a list"),
    (("binds", 0, "include_path"), {}, "'include_path' must be a list"),
    (("binds", 0, "order"), 5, "'order' must be one of"), (("binds", 0, "order"), ["first"], "'order' must be one of"),
    (("binds", 0, "source"), 5, "binds[0]: 'source' must be"),
    (("binds", 0, "hint"), 5, "'hint' must be a string"), (("binds", 0, "hint"), ["x"], "'hint' must be"),
    (("env",), ["FI_PROVIDER=cxi"], "'env' must be an object"), (("env",), "x", "'env' must be an object"),
    (("env",), None, "'env' must be an object"),
    (("env", ENV_NAME), "cxi", f"env {ENV_NAME} must be"), (("env", ENV_NAME), 5, f"env {ENV_NAME} must be"),
    (("env", ENV_NAME, "value"), 5, f"env {ENV_NAME}: 'value' and 'source' must be strings"),
    (("env", ENV_NAME, "source"), ["x"], f"env {ENV_NAME}: 'value' and 'source' must be strings"),
    (("closure",), [], "'closure' must be"), (("closure",), "x", "'closure' must be"),
    (("closure", "target"), 5, "'closure': 'target' must be"),
    (("closure", "source"), [], "'closure': 'source' must be"),
    (("fabric_gate",), [], "'fabric_gate' must be an object"),
    (("fabric_gate", "busbw_gbps"), "122.6", "fabric_gate.busbw_gbps must be a positive number"),
    (("fabric_gate", "size_bytes"), None, "fabric_gate.size_bytes must be a positive number"),
    (("fabric_gate", "floor_fraction"), 1.5, "fabric_gate.floor_fraction must be in (0, 1]"),
    (("fabric_gate", "sockets_busbw_gbps"), "5.4", "fabric_gate.sockets_busbw_gbps must be a positive number"),
    (("fabric_gate", "source"), 5, "fabric_gate.source must say where the figure comes from"),
    (("fabric_gate", "backend"), "rccl", "fabric_gate.backend must say what the figure was measured with"),
    (("fabric_gate", "device"), 5, "fabric_gate.device must say what the figure was measured with"),
    (("srun_args",), {}, "'srun_args' must be a list"), (("srun_args",), "--network=x", "'srun_args' must be a list"),
    (("srun_args", 0), "--network=disable_rdzv_get", "srun_args[0] must be an object with exactly 'value' and 'source'"),
    (("srun_args", 0, "value"), 5, "srun_args[0].value must be one srun option word starting with '--'"),
    (("srun_args", 0, "value"), "-N2", "srun_args[0].value must be one srun option word"),
    (("srun_args", 0, "value"), "--network disable_rdzv_get", "srun_args[0].value must be one srun option word"),
    (("srun_args", 0, "source"), "", "srun_args[0].source must say where the option comes from"),
    (("srun_args", 0, "source"), ["x"], "srun_args[0].source must say where the option comes from"),
    (("container_runtime",), "singularity", "'container_runtime' must be {\"command\""),
    (("container_runtime",), {"command": "singularity"}, "'container_runtime' must be {\"command\""),
    (("container_runtime",), {"command": "podman", "source": "x"},
     "'container_runtime'.command must be one of apptainer, singularity, got 'podman'"),
    (("container_runtime",), {"command": "singularity", "source": ""}, "'container_runtime'.source must say"),
]


def with_value(where: tuple, value: object) -> dict:
    data = copy.deepcopy(OLIVIA)
    holder = data
    for key in where[:-1]:
        holder = holder[key]
    holder[where[-1]] = value
    return data


@pytest.mark.parametrize("where, value, message", WRONG, ids=[f"{'.'.join(map(str, w))}={v!r}" for w, v, _ in WRONG])
def test_a_field_of_the_wrong_type_is_one_error_naming_the_file_and_the_field(where, value, message):
    path = str(SITES / "olivia.json")
    with pytest.raises(LaunchError) as error:
        parse_profile(with_value(where, value), path)
    assert str(error.value).startswith(f"bad site profile {path}: ")
    assert message in str(error.value)


def test_every_field_of_the_schema_has_a_wrong_type_case():
    covered = {where[:1] + where[2:3] for where, _, _ in WRONG if where[0] == "binds"} | {
        where[:1] for where, _, _ in WRONG}
    assert {(key,) for key in OLIVIA} <= covered
    assert {("binds", key) for bind in OLIVIA["binds"] for key in bind} | {("binds", "glob"), ("binds", "include_path")} \
        <= {("binds", where[2]) for where, _, _ in WRONG if where[0] == "binds" and len(where) == 3}


def test_a_wrong_type_through_ddp_launch_binds_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "lab.json").write_text(json.dumps({**with_value(("env",), ["FI_PROVIDER=cxi"]), "name": "lab"}))
    with mock.patch.dict(os.environ, {"DDP_SITES_DIR": str(tmp_path)}, clear=True):
        code = cli.main(["binds", "--site", "lab"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == (f"ddp-launch: error: bad site profile {tmp_path}/lab.json: 'env' must be an object of "
                   f"NAME: {{\"value\": ..., \"source\": ...}}\n")


@pytest.mark.parametrize("head", ["n" * 64 + ".cluster", "node\udcff1", "a..b"])
def test_a_head_name_no_resolver_takes_leaves_the_interface_to_nccl_instead_of_raising(head):
    from fakes.node import PROC_NET_ROUTE

    facts = NodeFacts(routes=parse_routes(PROC_NET_ROUTE), head=Resolved(Head.named(head, "the test's head"), None))
    plan = plan_fabric(FabricRequest(env={}, multi_node=True, head_address=head), facts, read_fabric_data(None, {}))
    assert "NCCL_SOCKET_IFNAME" not in {c.name for c in plan.changes}
    assert plan.notes == (f"warning: cannot resolve head node {head} to IPv4; socket interface left to NCCL/Gloo",)
