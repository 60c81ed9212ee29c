"""The run manifest: libraries from /proc/self/maps with their mounts, variables with who set them."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from ddp_contract import provenance

MAPS = textwrap.dedent("""\
    7f00-7f01 r-xp 00000000 00:2a 11 /usr/lib/x86_64-linux-gnu/libc.so.6
    7f01-7f02 r--p 00001000 00:2a 11 /usr/lib/x86_64-linux-gnu/libc.so.6
    7f02-7f03 r-xp 00000000 00:31 12 /opt/cray/libfabric/1.22.0/lib64/libfabric.so.1.25.0
    7f03-7f04 rw-p 00000000 00:00 0 [heap]
    7f04-7f05 r-xp 00000000 00:2a 13 /usr/lib/libnccl-net-ofi.so (deleted)
    7f05-7f06 r--p 00000000 00:2a 14 /usr/lib/locale/C.utf8/LC_CTYPE
    """)
MOUNTINFO = textwrap.dedent("""\
    501 500 0:42 / / rw,relatime - overlay overlay rw
    502 501 0:31 /opt/cray /opt/cray ro,relatime - xfs /dev/sda1 rw
    503 501 0:33 /home/u/my\\040libs /opt/my\\040libs rw - xfs /dev/sda1 rw
    """)


def test_each_mapped_shared_object_is_listed_once_in_order_without_the_deleted_mark():
    assert provenance.mapped_libraries(MAPS) == [
        "/usr/lib/x86_64-linux-gnu/libc.so.6", "/opt/cray/libfabric/1.22.0/lib64/libfabric.so.1.25.0",
        "/usr/lib/libnccl-net-ofi.so"]


def test_a_library_under_a_bind_mount_is_marked_bound_with_the_hosts_directory():
    table = provenance.mounts(MOUNTINFO)
    lib = provenance.describe_library("/opt/cray/libfabric/1.22.0/lib64/libfabric.so.1.25.0", table)
    assert (lib.mount, lib.mount_source, lib.bound, lib.version) == ("/opt/cray", "/opt/cray", True, "1.25.0")
    assert provenance.mount_of("/opt/my libs/libcxi.so.1", table) == ("/opt/my libs", "/home/u/my libs")
    assert not provenance.describe_library("/usr/lib/libz.so.1", table).bound


def test_the_key_libraries_are_found_by_name_and_torch_reports_its_own_version(tmp_path):
    import torch
    libs = [provenance.Library("/x/libnccl.so.2", "2", "/", "/"),
            provenance.Library("/x/libnccl-net.so", None, "/opt", "/opt"),
            provenance.Library(torch.__file__.replace("__init__.py", "lib/libtorch_cpu.so"), None, "/", "/"),
            provenance.Library("/x/libm.so.6", "6", "/", "/")]
    found = provenance.key_libraries(libs)
    assert sorted(found) == ["nccl", "net plugin", "torch"]
    assert found["nccl"][0]["version"] == "2"  # not loaded here: the file name's version stays
    assert found["net plugin"][0]["bound"]
    assert found["torch"][0]["version"] == str(torch.__version__)


def test_this_process_lists_what_it_really_mapped():
    seen = provenance.this_process()
    paths = [lib["path"] for lib in seen["libraries"]]
    assert any(os.path.basename(p).startswith("libtorch_cpu.so") for p in paths)
    assert seen["key_libraries"]["torch"]


def test_a_variable_the_launcher_set_is_its_and_one_nobody_planned_is_the_users():
    env = {"NCCL_DEBUG": "INFO", "TORCH_FR_BUFFER_SIZE": "2000", "FI_PROVIDER": "cxi",
           "TORCH_FR_DUMP_TEMP_FILE": "/r/forensics/fr-trace-rank", "HOME": "/root",
           "DDP_ENV_SOURCES": json.dumps({"TORCH_FR_BUFFER_SIZE": "launcher: Flight Recorder on",
                                          "FI_PROVIDER": "site profile: site olivia: CXI"})}
    got = provenance.environment(env, provenance.launcher_sources(env),
                                 {"TORCH_FR_DUMP_TEMP_FILE": "dumps into the run dir"})
    assert sorted(got) == ["FI_PROVIDER", "NCCL_DEBUG", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"]
    assert got["NCCL_DEBUG"]["set_by"].startswith("user")
    assert got["TORCH_FR_BUFFER_SIZE"]["set_by"].startswith("launcher")
    assert got["FI_PROVIDER"]["set_by"].startswith("site profile")
    assert got["TORCH_FR_DUMP_TEMP_FILE"]["set_by"].startswith("trainer")


def test_a_malformed_sources_variable_attributes_everything_to_the_user():
    assert provenance.launcher_sources({"DDP_ENV_SOURCES": "{not json"}) == {}


def test_image_labels_come_from_apptainers_labels_file(tmp_path):
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"org.opencontainers.image.revision": "abc123", "version": "1"}))
    img = provenance.image({"APPTAINER_CONTAINER": "/img/train.sif", "APPTAINER_NAME": "train.sif"}, str(labels))
    assert img["ids"] == {"APPTAINER_CONTAINER": "/img/train.sif", "APPTAINER_NAME": "train.sif"}
    assert provenance.source_revision(img["labels"]) == "abc123"


def test_the_three_lines_name_the_image_the_libraries_and_who_set_what():
    ranks = [{"host": "node1", "key_libraries": {"nccl": [{"path": "/l/libnccl.so.2", "version": "2.28.3",
                                                             "mount": "/", "mount_source": "/", "bound": False}]},
              "libraries": [{"path": "/opt/h/libcxi.so.1", "version": "1", "mount": "/opt/h",
                             "mount_source": "/h", "bound": True}]},
             {"host": "node2", "key_libraries": {}, "libraries": []}]
    m = provenance.manifest({"epochs": 1}, {"APPTAINER_CONTAINER": "/img/t.sif", "NCCL_DEBUG": "WARN"}, {},
                            ranks, "2.14.1")
    image, libs, env = provenance.summary_lines(m)
    assert image.startswith("Image: /img/t.sif")
    assert "nccl 2.28.3 /l/libnccl.so.2" in libs and "1 more from host binds: /opt/h/libcxi.so.1" in libs
    assert "by user: NCCL_DEBUG=WARN" in env and "node1 (ranks 0), node2 (ranks 1)" in env
    assert m["rank_map"] == {"0": "node1", "1": "node2"}


@pytest.mark.parametrize("text,expected", [("NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03\nGCC\n",
                                            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03")])
def test_the_host_driver_is_the_first_line_of_the_nvidia_proc_file(tmp_path, text, expected):
    version = tmp_path / "version"
    version.write_text(text)
    assert provenance.host_driver(str(version)) == expected
    assert provenance.host_driver(str(tmp_path / "absent")) is None


def test_the_manifest_keeps_what_nccls_config_files_set_and_the_known_problems_each_node_matches(tmp_path):
    (tmp_path / ".nccl.conf").write_text("NCCL_IB_TIMEOUT=22\nNCCL_DEBUG=TRACE\n")
    rows = tmp_path / "lab.json"
    rows.write_text(json.dumps({"schema": 1, "name": "lab", "rows": [{
        "id": "lab-nccl-2283", "summary": "hangs at init on our nodes", "effect": "hang",
        "versions": {"nccl": ">=2.28,<2.28.4"}, "fix": "module load NCCL/2.28.9", "source": "https://lab.example/wiki"}]}))
    ranks = [{"host": host, "key_libraries": {"nccl": [{"path": "/l/libnccl.so.2", "version": version, "mount": "/",
                                                        "mount_source": "/", "bound": False}]}, "libraries": []}
             for host, version in (("node1", "2.28.3"), ("node2", "2.28.3"), ("node3", "2.28.9"))]
    env = {"HOME": str(tmp_path), "NCCL_DEBUG": "WARN", "DDP_KNOWN_ISSUES": str(rows)}
    m = provenance.manifest({}, env, {}, ranks, "2.8.0")
    conf = [(line["name"], line["value"], line["effect"]) for line in m["nccl_conf"]]
    assert ("NCCL_IB_TIMEOUT", "22", "applies") in conf
    assert ("NCCL_DEBUG", "TRACE", "the environment's value wins") in conf
    [found] = m["known_issues"]["matches"]
    assert (found["id"], found["verdict"], found["nodes"]) == ("lab-nccl-2283", "FAIL", ["node1", "node2"])
    assert found["matched"] == {"nccl": "2.28.3"} and found["fix"] == "module load NCCL/2.28.9"
    json.dumps(m)  # the manifest is written as JSON
