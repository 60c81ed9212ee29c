"""The fabric defaults as data (containers/sites/fabrics): every value sourced, found in the repo
and in the image's layout, said once, and a broken file named in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_launch.errors import LaunchError
from ddp_launch.fabric.defaults import (fabric_files, load_fabric_defaults, parse_fabric_defaults, read_fabric_data,
                                        read_fabric_defaults, when_holds, when_problem)
from ddp_launch.sites import available_sites, load_site

REPO = Path(__file__).resolve().parents[3]
FABRICS = REPO / "containers" / "sites" / "fabrics"
SHIPPED = sorted(p.stem for p in FABRICS.glob("*.json"))


def test_the_shipped_fabrics_are_the_ones_the_launcher_reads():
    assert SHIPPED == ["common", "infiniband", "slingshot"]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_value_parses_and_carries_a_source(name):
    defaults = read_fabric_defaults(str(FABRICS / f"{name}.json"))
    assert defaults.env, name
    for item in defaults.env + defaults.host_libraries:
        assert len(item.source) > 10, item
    assert all(item.when is None or when_problem(item.when) is None for item in defaults.env)


def test_the_repo_layout_is_found_without_configuration():
    assert load_fabric_defaults("slingshot", {}).path == str(FABRICS / "slingshot.json")


@pytest.mark.parametrize("sites_dir_var", [True, False])
def test_the_image_layout_is_found_as_the_definition_files_copy_it(tmp_path, sites_dir_var):
    """%files: entrypoints/ddp_launch -> /opt/ddp/python/ddp_launch, containers/sites -> /opt/ddp/sites;
    %environment: DDP_SITES_DIR=/opt/ddp/sites (containers/gpu.def, cpu.def)."""
    opt = tmp_path / "opt" / "ddp"
    for package in ("ddp_launch", "ddp_contract"):
        shutil.copytree(REPO / "entrypoints" / package, opt / "python" / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "containers" / "sites", opt / "sites")
    env = {"PYTHONPATH": str(opt / "python"), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if sites_dir_var:
        env["DDP_SITES_DIR"] = str(opt / "sites")
    code = ("import os; from ddp_launch.fabric.defaults import load_fabric_defaults as load; "
            "print(*(load(n, os.environ).path for n in ('slingshot', 'infiniband', 'common')))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(opt / "sites" / "fabrics" / f"{n}.json")
                                   for n in ("slingshot", "infiniband", "common")]


def test_the_edge_reads_every_file_the_plan_may_need():
    assert sorted(fabric_files()) == SHIPPED
    assert {name: d.path for name, d in read_fabric_data(None, {}).defaults.items()} == {
        name: str(FABRICS / f"{name}.json") for name in SHIPPED}


def test_a_file_that_cannot_be_read_stops_only_a_plan_that_needs_it(tmp_path, monkeypatch):
    from ddp_launch.fabric import FabricRequest, defaults, plan_fabric
    from ddp_launch.facts import NodeFacts

    shutil.copy(FABRICS / "common.json", tmp_path / "common.json")
    monkeypatch.setattr(defaults, "fabric_dirs", lambda env: (str(tmp_path),))
    data = read_fabric_data(None, {})  # read once at the edge, slingshot.json missing: no error yet
    assert plan_fabric(FabricRequest(env={}, multi_node=False), NodeFacts(), data).fabric == "ethernet"
    with pytest.raises(LaunchError, match=r"fabric defaults fabrics/slingshot.json not found"):
        plan_fabric(FabricRequest(env={}, multi_node=False), NodeFacts(cxi_class=True), data)


def test_a_missing_file_is_one_line_naming_where_it_looked(tmp_path, monkeypatch):
    from ddp_launch.fabric import defaults

    monkeypatch.setattr(defaults, "fabric_dirs", lambda env: (str(tmp_path),))
    with pytest.raises(LaunchError, match=r"fabric defaults fabrics/slingshot.json not found \(searched "):
        load_fabric_defaults("slingshot", {})


GOOD = {"schema": 1, "name": "lab", "env": {"X_Y": {"value": "1", "source": "lab wiki"}}}


@pytest.mark.parametrize("change, message", [
    ({"env": {"X_Y": {"value": "1"}}}, "env X_Y must be"),
    ({"env": {"X_Y": {"value": "1", "source": ""}}}, "source non-empty"),
    ({"env": {"X_Y": {"value": "1", "source": "s", "when": "full_moon"}}}, "'when' names 'full_moon': use one of multi_node"),
    ({"env": {"x-y": {"value": "1", "source": "s"}}}, "not a valid variable name"),
    ({"schema": 2}, "'schema' must be 1"),
    ({"name": "other"}, "'name' is 'other' but the file is named lab.json"),
    ({"tables": []}, "unknown key(s) tables"),
    ({"host_libraries": [{"label": "x"}]}, "host_libraries[0] must have exactly the keys"),
    ({"host_libraries": [{"label": "x", "file": "(", "kind": "plain", "required": True, "fix": "f",
                          "source": "s"}]}, "'file' is not a regular expression"),
    ({"host_libraries": [{"label": "x", "file": "x", "kind": "magic", "required": True, "fix": "f",
                          "source": "s"}]}, "'kind' must be one of plain"),
])
def test_a_bad_file_names_itself_and_the_key(change, message):
    with pytest.raises(LaunchError) as error:
        parse_fabric_defaults({**GOOD, **change}, "/x/fabrics/lab.json")
    assert str(error.value).startswith("bad fabric defaults /x/fabrics/lab.json: ")
    assert message in str(error.value)


def test_a_file_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "lab.json"
    path.write_text('{"schema": 1,')
    with pytest.raises(LaunchError, match=r"lab.json cannot be read: .*; fix the file"):
        read_fabric_defaults(str(path))


def test_no_site_profile_repeats_a_fabric_default():
    """Each value is written once: a site sets only what differs from (or is not in) the fabric's."""
    fabric_values = {(item.name, item.value) for name in SHIPPED
                     for item in read_fabric_defaults(str(FABRICS / f"{name}.json")).env}
    for site in available_sites({}):
        repeated = {(item.name, item.value) for item in load_site(site, {}).env} & fabric_values
        assert not repeated, f"{site}.json repeats {sorted(repeated)} from containers/sites/fabrics"


def test_the_host_libraries_doctor_loads_are_in_dependency_order():
    labels = [library.label for library in read_fabric_defaults(str(FABRICS / "slingshot.json")).host_libraries]
    assert labels == ["libcxi", "libfabric", "{collective}", "OFI plugin"]


@pytest.mark.parametrize("vendor, collective, library, plugin", [
    ("nvidia", "NCCL", "libnccl.so.2", "libnccl-net.so"),
    # aws-ofi-rccl README (https://github.com/ROCm/aws-ofi-rccl): RCCL loads librccl-net.so.
    ("amd", "RCCL", "librccl.so.1", "librccl-net.so"),
])
def test_the_host_libraries_name_the_vendors_collective_and_its_net_plugin(vendor, collective, library, plugin):
    from ddp_launch.accelerators import load_accelerator
    from ddp_launch.fabric.defaults import for_accelerator

    accelerator = load_accelerator(vendor, {})
    found = [for_accelerator(item, accelerator)
             for item in read_fabric_defaults(str(FABRICS / "slingshot.json")).host_libraries]
    by_label = {item.label: item for item in found}
    assert list(by_label) == ["libcxi", "libfabric", collective, "OFI plugin"]
    assert re.fullmatch(by_label[collective].file, library)
    assert re.fullmatch(by_label["OFI plugin"].file, plugin)
    assert not re.fullmatch(by_label["OFI plugin"].file, plugin.replace(".", "x"))  # escaped, not a wildcard
    assert accelerator.ofi_plugin in by_label["OFI plugin"].fix


def test_the_data_files_are_plain_json_objects_in_file_order():
    data = json.loads((FABRICS / "slingshot.json").read_text())
    assert list(data["env"])[:2] == ["NCCL_NET", "NCCL_PROTO"]
    assert [item.name for item in read_fabric_defaults(str(FABRICS / "slingshot.json")).env] == list(data["env"])


@pytest.mark.parametrize("when, problem", [
    ("gh200", "names 'gh200'"), ("gpu=", "compares 'gpu='"), ("colour=red", "compares 'colour=red'"), ("", "must be"),
])
def test_a_when_that_names_no_condition_or_fact_is_refused(when, problem):
    assert problem in when_problem(when)


def test_the_ll128_condition_is_the_profiles_gpu_and_the_nodes_machine_as_data():
    # NVIDIA/nccl#2001: LL128 corrupts all-reduce on GH200; the rule lives in slingshot.json.
    item = next(i for i in read_fabric_defaults(str(FABRICS / "slingshot.json")).env if i.name == "NCCL_PROTO")
    assert item.when == "gpu=gh200 machine=aarch64"
    assert when_holds(item.when, {"gpu": "gh200", "machine": "aarch64"})
    assert not when_holds(item.when, {"gpu": "gh200", "machine": "x86_64"})
    assert not when_holds(item.when, {"gpu": "mi250x", "machine": "aarch64"})
    assert not when_holds(item.when, {"gpu": None, "machine": "aarch64"})
    assert when_holds("multi_node accelerator=amd", {"multi_node": True, "accelerator": "amd"})
    assert not when_holds("multi_node accelerator=amd", {"multi_node": False, "accelerator": "amd"})
