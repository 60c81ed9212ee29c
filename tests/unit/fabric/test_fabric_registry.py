"""The fabrics are a registry: ddp_contract.fabrics names them in detection order, each is its module in
ddp_launch/fabric/ and, where it has values, its containers/sites/fabrics JSON. A throwaway fabric
registered from tmp_path (its module, its JSON, its name) is listed, planned and doctored, with no other
file changed."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import typing
from pathlib import Path

import pytest

import ddp_contract.fabrics
from ddp_contract.nccl_log import UNLISTED_CAUSE, Transport, sockets_warning
from ddp_launch.doctor import Probes, run
from ddp_launch.errors import LaunchError
from ddp_launch.fabric import FabricRequest, detect_fabric, plan_fabric
from ddp_launch.fabric.common import Fabric
from ddp_launch.fabric.defaults import fabric_files, read_fabric_data
from ddp_launch.fabric.registry import registered
from ddp_launch.facts import NodeFacts, RdmaDevice
from ddp_launch.sites import load_site, parse_profile

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "containers" / "sites" / "fabrics"


def test_the_registry_is_the_contracts_names_in_detection_order():
    assert tuple(fabric.NAME for fabric in registered()) == ddp_contract.fabrics.FABRICS
    assert registered()[-1].NAME == "ethernet"  # every node's: detection falls through to it


@pytest.mark.parametrize("name", ddp_contract.fabrics.FABRICS)
def test_every_fabric_module_has_the_whole_shape(name):
    fabric = next(f for f in registered() if f.NAME == name)
    members = set(typing.get_type_hints(Fabric)) | {"detect", "plan"}
    assert {member for member in members if not hasattr(fabric, member)} == set()
    assert fabric.DEVICES or not fabric.HIGH_SPEED  # --require-fabric's error says where to look


def test_every_shipped_data_file_is_a_registered_fabrics_or_common():
    with_defaults = {fabric.NAME for fabric in registered() if fabric.HAS_DEFAULTS}
    assert {path.stem for path in SHIPPED.glob("*.json")} == with_defaults | {"common"}


# -- a fabric registered from tmp_path: AWS's Elastic Fabric Adapter, as a contributor would add it ------

EFA_MODULE = '''
"""A fabric that ships with no file of the repository: registered by the test."""
NAME = "efa"
TITLE = "EFA"
HIGH_SPEED = True
HAS_DEFAULTS = True
DEVICES = ("/sys/class/infiniband/rdmap*",)
NCCL_IB_TRANSPORT = False
LIBFABRIC_PROVIDER = "efa"
MISSING = "no rdmap* device in /sys/class/infiniband (found: {found})"
MISSING_FIX = MISSING_FIX_IN_A_POD = "run on an instance with an EFA attached"


def detect(facts):
    return any(device.name.startswith("rdmap") for device in facts.rdma_devices)


def plan(builder, job):
    for item in job.defaults.applicable(job.conditions):
        builder.default(item.name, item.value, item.source)
'''
# Values from AWS's "Get started with EFA and NCCL" (docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html).
EFA_DEFAULTS = {
    "schema": 1, "name": "efa", "description": "AWS Elastic Fabric Adapter through libfabric's efa provider.",
    "env": {
        "FI_PROVIDER": {"value": "efa", "source": "AWS EFA user guide: libfabric's efa provider"},
        "FI_EFA_USE_DEVICE_RDMA": {"value": "1", "when": "multi_node", "source": "AWS EFA user guide: RDMA reads"},
    },
    "host_libraries": [{"label": "libfabric", "file": "libfabric\\.so\\.1", "kind": "libfabric", "required": True,
                        "fix": "bind the host libfabric with the efa provider", "source": "AWS EFA installer"}],
}
EFA_DEVICE = RdmaDevice("rdmap0s6", "1", "Ethernet", None)


@pytest.fixture
def efa(tmp_path, monkeypatch) -> dict:
    """The fabric's module and JSON written in tmp_path, and its name put in the contract's list before
    InfiniBand (an EFA device is an RDMA device too): what a contributor's three edits would do."""
    module_path = tmp_path / "efa.py"
    module_path.write_text(EFA_MODULE)
    spec = importlib.util.spec_from_file_location("ddp_launch.fabric.efa", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "ddp_launch.fabric.efa", module)
    monkeypatch.setattr(ddp_contract.fabrics, "FABRICS", ("slingshot", "efa", "infiniband", "ethernet"))
    sites = tmp_path / "sites"
    (sites / "fabrics").mkdir(parents=True)
    (sites / "fabrics" / "efa.json").write_text(json.dumps(EFA_DEFAULTS))
    (sites / "aws.json").write_text(json.dumps({"schema": 1, "name": "aws", "fabric": "efa", "binds": []}))
    return {"DDP_SITES_DIR": str(sites)}


def test_a_registered_fabric_is_listed_where_the_fabrics_are(efa):
    assert load_site("aws", efa).fabric == "efa"
    with pytest.raises(LaunchError, match="'fabric' must be one of slingshot, efa, infiniband, ethernet, auto, got 'x'"):
        parse_profile({"schema": 1, "name": "lab", "fabric": "x", "binds": []}, "/x/lab.json")
    assert fabric_files() == ("slingshot", "efa", "infiniband", "common")
    assert read_fabric_data(None, efa).defaults["efa"].path == efa["DDP_SITES_DIR"] + "/fabrics/efa.json"


def test_a_registered_fabric_is_detected_and_planned_from_its_json(efa):
    facts = NodeFacts(rdma_devices=(EFA_DEVICE,))
    assert detect_fabric(facts) == "efa"
    plan = plan_fabric(FabricRequest(env={}, multi_node=True, require_fabric=True), facts, read_fabric_data(None, efa))
    changes = {change.name: change for change in plan.changes}
    assert plan.fabric == "efa"
    assert changes["FI_PROVIDER"].value == "efa" and "AWS EFA user guide" in changes["FI_PROVIDER"].reason
    assert changes["FI_EFA_USE_DEVICE_RDMA"].value == "1"
    assert changes["TORCH_NCCL_ASYNC_ERROR_HANDLING"].value == "1"  # common.json, as for every fabric
    assert changes["DDP_EXPECT_FABRIC"].value == "efa"  # the trainer checks NCCL's choice against it
    with pytest.raises(LaunchError, match=r"no /dev/cxi\*, /sys/class/cxi, /sys/class/infiniband/rdmap\* or "
                                          r"/sys/class/infiniband\)"):
        plan_fabric(FabricRequest(env={}, multi_node=True, require_fabric=True), NodeFacts(), read_fabric_data(None, efa))


def test_a_registered_fabric_is_doctored_by_its_module_and_json(efa, tmp_path):
    commands = []

    def run_command(argv):
        commands.append(list(argv))
        return 0, "provider: efa\n"

    probes = Probes(torch_info=lambda: None, load_library=lambda path, kind: "", run_command=run_command,
                    connect=lambda address, port, timeout: "refused",
                    which=lambda name: "/usr/bin/fi_info" if name == "fi_info" else None,
                    filesystem_bytes=lambda path: 16 << 30)
    root = tmp_path / "node"  # no EFA device here
    (root / "sys" / "class" / "net" / "eth0").mkdir(parents=True)
    out = io.StringIO()
    bound = {**efa, "APPTAINER_BIND": "/opt/elsewhere:/opt/elsewhere"}  # bound, but not the library
    run(["--root", str(root), "--json", "--site", "aws", "--offline"], bound, out, probes)
    checks = {check["name"]: check for check in json.loads(out.getvalue())["checks"]}
    assert checks["fabric devices"]["status"] == "WARN"
    assert checks["fabric devices"]["detail"] == "EFA expected but no rdmap* device in /sys/class/infiniband (found: none)"
    assert checks["fabric devices"]["fix"] == "run on an instance with an EFA attached"
    assert checks["fi_info -p efa"]["status"] == "OK" and commands[-1][-2:] == ["-p", "efa"]
    assert checks["libfabric"]["status"] == "WARN"  # efa.json's host library, not bound on this node
    assert checks["libfabric"]["fix"] == "bind the host libfabric with the efa provider"


def test_the_trainers_check_warns_of_sockets_on_a_registered_fabric(efa):
    socket = Transport("Socket", None, None, None, (), None)
    assert sockets_warning(socket, "efa", {}).endswith(f"Cause: {UNLISTED_CAUSE}.")
