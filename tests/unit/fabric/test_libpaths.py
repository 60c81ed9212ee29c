"""The in-container half: LD_LIBRARY_PATH / CPATH from the profile, existing dirs only, user kept."""

from __future__ import annotations

from fakes.node import node_facts

from ddp_launch.fabric.libpaths import library_path_changes
from ddp_launch.sites import load_site

OLIVIA = load_site("olivia", {})


def bound(node, *dirs):
    for directory in dirs:
        node.directory(directory)


def changes(node, env=None):
    existing = node_facts(node, site="olivia").existing_dirs
    return {c.name: c.value for c in library_path_changes(OLIVIA, env or {}, existing)}


def test_plugin_first_then_host_libraries_then_the_closure_behind_the_users_then_appended(node):
    bound(node, "/opt/aws-ofi-nccl/lib", "/opt/libfabric/lib64", "/opt/nccl/lib", "/opt/host-libs", "/opt/nvidia/hpc_sdk/lib")
    value = changes(node, {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"})["LD_LIBRARY_PATH"]
    assert value.split(":") == [
        "/opt/aws-ofi-nccl/lib", "/opt/libfabric/lib64", "/opt/nccl/lib",
        "/usr/local/cuda/lib64", "/opt/host-libs", "/opt/nvidia/hpc_sdk/lib",
    ]


def test_the_images_own_library_dirs_come_before_the_host_closure(node):
    # ld.so(8): LD_LIBRARY_PATH is searched before ld.so.cache and the trusted directories, so
    # /opt/host-libs on it would replace the image's libcurl, libssl, libzstd for every process.
    bound(node, "/opt/libfabric/lib64", "/opt/host-libs", "/usr/lib/aarch64-linux-gnu", "/usr/lib")
    facts = node_facts(node, site="olivia")
    from ddp_launch import facts as probe
    image_dirs = probe.probe(str(node.root), loader=True).loader_dirs
    assert image_dirs == ("/usr/lib", "/usr/lib/aarch64-linux-gnu")
    value = {c.name: c.value for c in library_path_changes(OLIVIA, {}, facts.existing_dirs, image_dirs)}
    assert value["LD_LIBRARY_PATH"].split(":") == [
        "/opt/libfabric/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu", "/opt/host-libs"]


def test_only_existing_dirs_are_added(node):
    bound(node, "/opt/libfabric/lib64")
    assert changes(node)["LD_LIBRARY_PATH"] == "/opt/libfabric/lib64"


def test_nothing_bound_changes_nothing(node):
    node.directory("/opt")
    assert changes(node, {"LD_LIBRARY_PATH": "/usr/lib"}) == {}


def test_user_entries_are_not_duplicated(node):
    bound(node, "/opt/libfabric/lib64")
    assert changes(node, {"LD_LIBRARY_PATH": "/opt/libfabric/lib64:/mine"}) == {}


def test_cpath_gets_libfabric_headers_before_the_users(node):
    bound(node, "/opt/libfabric/include")
    assert changes(node, {"CPATH": "/mine/include"})["CPATH"] == "/opt/libfabric/include:/mine/include"
