"""ddp_launch.elf reads DT_NEEDED, DT_SONAME, DT_RPATH and DT_RUNPATH as readelf does."""

from __future__ import annotations

import glob
import re
import shutil
import subprocess

import pytest
from fakes.elf_tree import build_library, write_minimal_elf

from ddp_launch.elf import ElfError, read_elf

READELF = shutil.which("readelf")


def readelf_dynamic(path: str) -> dict:
    """binutils' view of the dynamic section, for comparison."""
    text = subprocess.run([READELF, "-dW", path], capture_output=True, text=True, check=True).stdout
    found = {"needed": [], "soname": None, "rpath": [], "runpath": []}
    for kind, value in re.findall(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+[^\[]*\[(.*)\]", text):
        if kind == "NEEDED":
            found["needed"].append(value)
        elif kind == "SONAME":
            found["soname"] = value
        else:
            found[kind.lower()].extend(p for p in value.split(":") if p)
    return found


def as_dict(info) -> dict:
    return {"needed": list(info.needed), "soname": info.soname, "rpath": list(info.rpath), "runpath": list(info.runpath)}


def test_cc_built_library_with_runpath_and_origin(tmp_path):
    dep = build_library(tmp_path / "libdep.so.3", "libdep.so.3")
    lib = build_library(tmp_path / "libtop.so.1.2", "libtop.so.1", needs=[dep], runpath=["$ORIGIN/../private", "/opt/x"])
    info = read_elf(str(lib))
    assert info.soname == "libtop.so.1"
    assert info.needed[0] == "libdep.so.3" and "libc.so.6" in info.needed
    assert info.runpath == ("$ORIGIN/../private", "/opt/x") and info.rpath == ()
    assert (info.elf_class, info.byte_order) == (64, "<")


def test_cc_built_library_with_old_style_rpath(tmp_path):
    lib = build_library(tmp_path / "libold.so", "libold.so", rpath=["/opt/a", "$ORIGIN"])
    info = read_elf(str(lib))
    assert info.rpath == ("/opt/a", "$ORIGIN") and info.runpath == ()


@pytest.mark.skipif(READELF is None, reason="readelf (binutils) not installed")
def test_agrees_with_readelf_on_this_machines_libraries():
    libraries = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/*.so.*") + glob.glob("/usr/lib/aarch64-linux-gnu/*.so.*"))
    libraries += sorted(glob.glob("/usr/lib64/*.so.*"))
    checked = 0
    for path in libraries[:60]:
        info = read_elf(path)
        if info is None:
            continue
        assert as_dict(info) == readelf_dynamic(path), path
        checked += 1
    assert checked >= 10, "too few system libraries to compare with"


@pytest.mark.parametrize("elf_class, byte_order", [(32, "<"), (32, ">"), (64, ">"), (64, "<")])
def test_every_class_and_byte_order(tmp_path, elf_class, byte_order):
    path = write_minimal_elf(tmp_path / "libx.so.2", elf_class, byte_order, machine=22, soname="libx.so.2",
                             needed=("liba.so.1", "libb.so.7"), rpath=("/r1", "/r2"), runpath=("$ORIGIN",))
    info = read_elf(str(path))
    assert (info.elf_class, info.byte_order, info.machine) == (elf_class, byte_order, 22)
    assert info.needed == ("liba.so.1", "libb.so.7") and info.soname == "libx.so.2"
    assert info.rpath == ("/r1", "/r2") and info.runpath == ("$ORIGIN",)


@pytest.mark.skipif(READELF is None, reason="readelf (binutils) not installed")
def test_hand_made_big_endian_object_reads_the_same_in_readelf(tmp_path):
    path = write_minimal_elf(tmp_path / "libbe.so", 32, ">", machine=8, soname="libbe.so", needed=("libz.so.1",))
    assert readelf_dynamic(str(path)) == as_dict(read_elf(str(path)))


def test_linker_script_is_not_elf(tmp_path):
    script = tmp_path / "libc.so"
    script.write_text("/* GNU ld script */\nGROUP ( /lib64/libc.so.6 )\n")
    assert read_elf(str(script)) is None


def test_truncated_elf_is_an_elf_error(tmp_path):
    whole = write_minimal_elf(tmp_path / "libwhole.so", soname="libwhole.so").read_bytes()
    cut = tmp_path / "libcut.so"
    cut.write_bytes(whole[:70])
    with pytest.raises(ElfError, match="truncated program header"):
        read_elf(str(cut))


def test_compatibility_is_class_byte_order_and_machine(tmp_path):
    x86 = read_elf(str(write_minimal_elf(tmp_path / "a.so", 64, "<", 62)))
    assert x86.compatible(read_elf(str(write_minimal_elf(tmp_path / "b.so", 64, "<", 62))))
    assert not x86.compatible(read_elf(str(write_minimal_elf(tmp_path / "c.so", 32, "<", 62))))
    assert not x86.compatible(read_elf(str(write_minimal_elf(tmp_path / "d.so", 64, "<", 183))))
