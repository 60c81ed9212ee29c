"""FI_MR_CACHE_MONITOR: userfaultfd on Slingshot (HPE's ccl_env.sh, CSCS), except where the host's libfabric
defaults to kdreg2 and its module is loaded: that site's choice stands (HPE's tuning guides list kdreg2 as
"another valid option"; LUMI-AI-Guide PR #118 announces it as the coming default). libfabric's default is
read from the library file as ofiwg/libfabric builds it (ddp_launch/mr_monitor.py); here against real ELF
files built with cc, carrying the strings a libfabric build carries."""
from __future__ import annotations

import pytest
from fakes.elf_tree import build_library
from fakes.node import FakeNode

from ddp_launch import facts, mr_monitor
from ddp_launch.fabric import FabricRequest, directories_to_probe, plan_fabric
from ddp_launch.fabric.defaults import read_fabric_data, when_holds, when_problem

# FI_MR_CACHE_MONITOR's help text as ofiwg/libfabric's util_mem_monitor.c writes it (fi_param_define), with
# HAVE_MR_CACHE_MONITOR_DEFAULT from ./configure --with-default-monitor=NAME, else the literal " Userfaultfd".
HELP = ("Define a default memory registration monitor. The monitor checks for virtual to physical memory address "
        "changes.  Options are: userfaultfd, memhooks kdreg2, and disabled.  Userfaultfd is a Linux kernel "
        "feature. Memhooks operates by intercepting memory allocation and free calls. kdreg2 is a supplied as a "
        "loadable Linux kernel module. {default} is the default if available on the system. 'disabled' option "
        "disables memory caching.")
KDREG2_STARTED = "Kdreg2 memory monitor started.\n"  # kdreg2_mem_monitor.c, built only with the kdreg2 monitor


def library_bytes(default: str = "Userfaultfd", kdreg2_built_in: bool = False) -> bytes:
    return (b"\0\x7fELF..." + HELP.format(default=default).encode() + b"\0"
            + (KDREG2_STARTED.encode() + b"\0" if kdreg2_built_in else b""))


@pytest.mark.parametrize(("data", "real_name", "monitor"), [
    # ./configure --with-default-monitor=...: the help text names it, whatever the version.
    (library_bytes("kdreg2", kdreg2_built_in=True), "libfabric.so.1.29.0", "kdreg2"),
    (library_bytes("uffd", kdreg2_built_in=True), "libfabric.so.1.31.1", "userfaultfd"),
    (library_bytes("memhooks"), "libfabric.so.1", "memhooks"),
    # No configured default: kdreg2 built in is the first choice from libfabric 2.4.0 (libtool age 30) on
    # (ofiwg/libfabric 1009ad850), and the last before it.
    (library_bytes(kdreg2_built_in=True), "libfabric.so.1.30.0", "kdreg2"),
    (library_bytes(kdreg2_built_in=True), "libfabric.so.1.32.1", "kdreg2"),
    (library_bytes(kdreg2_built_in=True), "libfabric.so.1.29.1", None),   # 2.3.1: memhooks or userfaultfd first
    (library_bytes(kdreg2_built_in=True), "libfabric.so.1", None),        # no version in the name: not told
    (library_bytes(), "libfabric.so.1.31.0", None),                       # no kdreg2 monitor built in
    (b"\0\x7fELF an older libfabric, no such text", "libfabric.so.1.25.0", None),
])
def test_libfabrics_default_monitor_is_read_from_its_file(data, real_name, monitor):
    assert mr_monitor.default_monitor(data, real_name) == monitor


def slingshot_node(node: FakeNode, kdreg2_device: bool, real_name: str, source_default: str,
                   kdreg2_built_in: bool = True) -> None:
    """A LUMI-G node inside the container: CXI NICs, and the image's libfabric where ld.so.conf finds it
    (LUMI AI Factory's layout), a real shared object carrying libfabric's strings."""
    node.cxi(4)
    if kdreg2_device:
        node.file(mr_monitor.KDREG2_DEVICE)
    text = HELP.format(default=source_default).replace('"', '\\"')
    strings = f'const char *fi_mr_cache_monitor_help = "{text}";\n'
    if kdreg2_built_in:
        strings += 'const char *kdreg2_started = "Kdreg2 memory monitor started.\\n";\n'
    multiarch = node.root / "usr/lib/x86_64-linux-gnu"
    build_library(multiarch / real_name, "libfabric.so.1",
                  source=strings + "unsigned int fi_version(void) { return (2u << 16) | 4u; }\n")
    if real_name != "libfabric.so.1":
        (multiarch / "libfabric.so.1").symlink_to(real_name)
    node.file("/etc/ld.so.conf.d/x86_64-linux-gnu.conf", "/usr/lib/x86_64-linux-gnu\n")
    node.file("/opt/rocm/lib/librccl-net.so")  # RCCL's OFI plugin, which NCCL_NET needs
    node.file("/etc/ld.so.conf.d/rocm-30.conf", "/opt/rocm/lib\n")


def lumi_plan(node: FakeNode, env=None):
    data = read_fabric_data("lumi", {})
    probed = facts.probe(str(node.root), directories_to_probe(data), plugin_dirs=directories_to_probe(data),
                         accelerator=data.accelerator)
    return probed, plan_fabric(FabricRequest(env=env or {}, multi_node=True), probed, data)


def test_a_libfabric_built_to_default_to_kdreg2_with_its_module_loaded_keeps_kdreg2(node):
    slingshot_node(node, kdreg2_device=True, real_name="libfabric.so.1.30.0", source_default="kdreg2")
    probed, plan = lumi_plan(node)
    assert probed.libfabric_monitor == "kdreg2" and probed.kdreg2_default
    assert "FI_MR_CACHE_MONITOR" not in {c.name for c in plan.changes}
    [note] = [f for f in plan.findings if f.topic == "monitor"]
    assert note.text.startswith("FI_MR_CACHE_MONITOR=userfaultfd not set: the host's libfabric defaults to kdreg2 "
                                "and /dev/kdreg2 is present")


def test_libfabric_2_4_with_kdreg2_built_in_defaults_to_it_without_being_configured(node):
    slingshot_node(node, kdreg2_device=True, real_name="libfabric.so.1.30.0", source_default="Userfaultfd")
    probed, plan = lumi_plan(node)
    assert probed.kdreg2_default and "FI_MR_CACHE_MONITOR" not in {c.name for c in plan.changes}


@pytest.mark.parametrize(("kdreg2_device", "real_name", "source_default"), [
    (False, "libfabric.so.1.30.0", "kdreg2"),        # no kdreg2 module: its monitor cannot start
    (True, "libfabric.so.1.29.1", "Userfaultfd"),     # 2.3.1 with kdreg2 built in: memhooks comes first
    (True, "libfabric.so.1.30.0", "uffd"),            # configured to userfaultfd
])
def test_userfaultfd_is_forced_where_kdreg2_is_not_the_hosts_default(node, kdreg2_device, real_name, source_default):
    slingshot_node(node, kdreg2_device=kdreg2_device, real_name=real_name, source_default=source_default)
    probed, plan = lumi_plan(node)
    assert not probed.kdreg2_default
    assert {c.name: c.value for c in plan.changes}["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert not [f for f in plan.findings if f.topic == "monitor"]


def test_a_users_monitor_is_kept_either_way(node):
    slingshot_node(node, kdreg2_device=True, real_name="libfabric.so.1.30.0", source_default="kdreg2")
    _, plan = lumi_plan(node, env={"FI_MR_CACHE_MONITOR": "memhooks"})
    assert "FI_MR_CACHE_MONITOR" not in {c.name for c in plan.changes}
    assert not [f for f in plan.findings if f.topic == "monitor"]


def test_a_condition_may_be_negated_and_a_misspelt_one_is_refused():
    assert when_holds("!kdreg2_default", {"kdreg2_default": False})
    assert not when_holds("!kdreg2_default", {"kdreg2_default": True})
    assert when_holds("multi_node !kdreg2_default", {"multi_node": True, "kdreg2_default": False})
    assert when_problem("!kdreg2_default") is None
    assert "names '!kdreg3_default'" in when_problem("!kdreg3_default")
