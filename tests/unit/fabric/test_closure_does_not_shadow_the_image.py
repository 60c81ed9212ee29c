"""The host closure (/opt/host-libs) must not replace the image's own libraries, with real ELF files.

ld.so(8) (https://man7.org/linux/man-pages/man8/ld.so.8.html, "Shared libraries are searched
for in the following order"): LD_LIBRARY_PATH comes before /etc/ld.so.cache and the trusted
directories. So a closure directory on LD_LIBRARY_PATH wins over the image's copy of any soname
both carry (libcurl, libssl, libzstd on a Cray EX host), for every process in the container,
unless the image's own directories come before it on the path. The fabric's own libraries
(plugin, libfabric, NCCL) stay in front; only what the image lacks comes from the host.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from fakes.elf_tree import bind_into, build_fake_olivia_host, build_library

from ddp_launch import binds as binds_cli
from ddp_launch import planner
from ddp_launch.fabric.defaults import read_fabric_data
from ddp_launch.facts import Resolved, under
from ddp_launch.options import read_options

# The image's own copy of a soname the host closure also carries (libfakejson.so.5 stands
# for libcurl or libzstd), in the image's multiarch directory.
IMAGE_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
# Which file of each soname the child process mapped, as /proc/self/maps shows it.
CHILD = r"""
import ctypes, json, sys
ctypes.CDLL(sys.argv[1])
maps = [line.split()[-1] for line in open("/proc/self/maps") if ".so" in line]
print(json.dumps(sorted(set(m for m in maps if "fake" in m or "libcxi" in m))))
"""
JOB = {"SLURM_JOB_ID": "771234", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "olivia-gh[001-002]",
       "SLURM_STEP_NODELIST": "olivia-gh[001-002]", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2",
       "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "0",
       "SLURM_PROCID": "0", "SLURMD_NODENAME": "olivia-gh001"}


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    """The container's tree: the image's own libfakejson, the host's binds (`ddp-launch binds`) on top."""
    base = tmp_path_factory.mktemp("closure")
    host = build_fake_olivia_host(base / "host")
    out, err = io.StringIO(), io.StringIO()
    assert binds_cli.run(["--site", "olivia", "--root", str(host["root"])], {}, out, err) == 0, err.getvalue()
    root = base / "container"
    bind_into(root, out.getvalue().strip())
    assert (root / "opt/host-libs/libfakejson.so.5").is_file()  # the closure carries a host copy
    build_library(root / IMAGE_LIB_DIR.lstrip("/") / "libfakejson.so.5", "libfakejson.so.5")
    (root / "dev").mkdir()
    for index in range(4):
        (root / "dev" / f"cxi{index}").touch()
    return root


def planned_library_path(root) -> str:
    argv = ["--site", "olivia", "--cpu-workers", "1"]
    launch = planner.parse(read_options(argv, JOB), JOB, read_fabric_data("olivia", JOB))
    asked = planner.questions(launch)
    # Not the name service: the head did not resolve here (the plan passes its name).
    facts = replace(planner.probe(replace(asked, head=None), str(root)), head=Resolved(asked.head, None))
    value = next(c.value for c in planner.plan(launch, facts).changes if c.name == "LD_LIBRARY_PATH")
    return value


def loaded(root, library_path: str) -> list[str]:
    """Load the bound libfabric in a fresh process, as a worker would, with the container's paths under root."""
    mapped = ":".join(under(str(root), d) for d in library_path.split(":"))
    done = subprocess.run([sys.executable, "-c", CHILD, str(root / "opt/libfabric/lib64/libfabric.so.1")],
                          env={"LD_LIBRARY_PATH": mapped, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=True)
    return [path[len(str(root)):] for path in json.loads(done.stdout)]


def test_the_image_copy_wins_and_the_host_fills_only_what_the_image_lacks(container):
    path = planned_library_path(container)
    maps = loaded(container, path)
    assert f"{IMAGE_LIB_DIR}/libfakejson.so.5" in maps, maps
    assert "/opt/host-libs/libfakejson.so.5" not in maps
    # what the image lacks still comes from the host closure
    assert "/opt/host-libs/libcxi.so.1" in maps and "/opt/host-libs/libfakenl-3.so.200" in maps


def test_with_the_closure_first_the_host_copy_would_shadow_the_image(container):
    # The rule the order above relies on, shown by the loader itself.
    maps = loaded(container, f"/opt/libfabric/lib64:/opt/host-libs:{IMAGE_LIB_DIR}")
    assert "/opt/host-libs/libfakejson.so.5" in maps and f"{IMAGE_LIB_DIR}/libfakejson.so.5" not in maps


def test_the_fabric_libraries_stay_in_front_of_the_image(container):
    entries = planned_library_path(container).split(":")
    assert entries.index("/opt/libfabric/lib64") < entries.index(IMAGE_LIB_DIR) < entries.index("/opt/host-libs")
