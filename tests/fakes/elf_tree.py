"""Real ELF shared objects, built with cc and linked to each other, in a fake Olivia host tree.

`build_fake_olivia_host(root)` lays out what `ddp-launch binds --site olivia --root ROOT`
probes on an HPE Cray EX node; `bind_into(container_root, apptainer_bind)` then copies
what an APPTAINER_BIND value names to where Apptainer would mount it, so the doctor
(and the e2e harness) can load the libraries as the container would see them.
Every library but libc carries a fake name, so the real system never resolves one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CC = shutil.which("cc") or "/usr/bin/cc"
LIBFABRIC_VERSION = "2.3.1"


def build_library(path: Path, soname: str, needs=(), rpath=(), runpath=(), source: str = "") -> Path:
    """cc -shared: DT_SONAME soname, DT_NEEDED for each file in needs (linked by path, so
    DT_NEEDED is that file's soname), DT_RPATH / DT_RUNPATH as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = soname.split(".so")[0].replace("-", "_")
    c_file = path.parent / f".{path.name}.c"
    c_file.write_text(source or f"int {stem}_marker(void) {{ return 1; }}\n")
    argv = [CC, "-shared", "-fPIC", "-o", str(path), str(c_file), f"-Wl,-soname,{soname}",
            "-Wl,--no-as-needed", *[str(n) for n in needs]]
    if rpath:
        argv += ["-Wl,--disable-new-dtags", "-Wl,-rpath," + ":".join(rpath)]
    if runpath:
        argv += ["-Wl,--enable-new-dtags", "-Wl,-rpath," + ":".join(runpath)]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    c_file.unlink()
    return path


def _link(path: Path, target: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def build_fake_olivia_host(root: Path) -> dict:
    """Build the host tree under root; return what it made.

    Host paths (all under root):
      /usr/lib64/libcxi.so.1              needs libfakenl-3.so.200
      /usr/lib64/libfakenl-3.so.200       needs libfakejson.so.5
      /usr/lib64/libfakejson.so.5 -> libfakejson.so.5.0.0
      /opt/cray/libfabric/2.3.1/lib64/libfabric.so.1 -> libfabric.so.1.23.0
                                          needs libcxi.so.1, libfakejson.so.5, libfakeatomic.so.1;
                                          DT_RUNPATH $ORIGIN/../private
      /opt/cray/libfabric/2.3.1/private/libfakeatomic.so.1   (found only through $ORIGIN)
      /opt/cray/libfabric/2.3.1/bin/fi_info  a real executable: prints "provider: cxi", linked to libfabric
      /cluster/work/support/nccl/lib/libnccl.so.2
      /cluster/work/support/nccl/lib/libnccl-net.so   needs libfabric.so.1, libfakehwloc.so.15;
                                          DT_RPATH /opt/fakevendor/hwloc/lib (absolute)
      /opt/fakevendor/hwloc/lib/libfakehwloc.so.15    needs libfakeudev.so.1
      /opt/fakevendor/lib64/libfakeudev.so.1          found through /etc/ld.so.conf's include
      /etc/ld.so.conf (include /etc/ld.so.conf.d/*.conf), /etc/ld.so.conf.d/vendor.conf

    Returns {"root": root, "libraries": {soname: Path under root},
    "closure": {soname: (host path, soname of the library that first needs it)}}:
    the libraries `ddp-launch binds` must add, and why.
    """
    lib64 = root / "usr/lib64"
    fabric = root / f"opt/cray/libfabric/{LIBFABRIC_VERSION}"
    nccl = root / "cluster/work/support/nccl/lib"
    json_lib = build_library(lib64 / "libfakejson.so.5.0.0", "libfakejson.so.5")
    _link(lib64 / "libfakejson.so.5", "libfakejson.so.5.0.0")
    nl = build_library(lib64 / "libfakenl-3.so.200", "libfakenl-3.so.200", needs=[json_lib])
    cxi = build_library(lib64 / "libcxi.so.1", "libcxi.so.1", needs=[nl])
    atomic = build_library(fabric / "private/libfakeatomic.so.1", "libfakeatomic.so.1")
    libfabric = build_library(
        fabric / "lib64/libfabric.so.1.23.0", "libfabric.so.1", needs=[cxi, json_lib, atomic],
        runpath=["$ORIGIN/../private"],
        source="unsigned int fi_version(void) { return (2u << 16) | 3u; }\n",
    )
    _link(fabric / "lib64/libfabric.so.1", "libfabric.so.1.23.0")
    _link(fabric / "lib64/libfabric.so", "libfabric.so.1")
    (fabric / "include").mkdir(parents=True)
    fi_info = fabric / "bin/fi_info"
    fi_info.parent.mkdir(parents=True)
    c_file = fabric / "bin/.fi_info.c"
    c_file.write_text('#include <stdio.h>\nunsigned int fi_version(void);\n'
                      'int main(void) { printf("provider: cxi\\n    fabric: cxi\\n    version: %u\\n", fi_version() >> 16);'
                      ' return 0; }\n')
    subprocess.run([CC, "-o", str(fi_info), str(c_file), str(libfabric), "-Wl,--enable-new-dtags",
                    "-Wl,-rpath,$ORIGIN/../lib64"], check=True, capture_output=True, text=True)
    c_file.unlink()
    udev = build_library(root / "opt/fakevendor/lib64/libfakeudev.so.1", "libfakeudev.so.1")
    hwloc = build_library(root / "opt/fakevendor/hwloc/lib/libfakehwloc.so.15", "libfakehwloc.so.15", needs=[udev])
    nccl_lib = build_library(nccl / "libnccl.so.2", "libnccl.so.2")
    plugin = build_library(nccl / "libnccl-net.so", "libnccl-net.so", needs=[libfabric, hwloc],
                           rpath=["/opt/fakevendor/hwloc/lib"])
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("# as on SLES 15\ninclude /etc/ld.so.conf.d/*.conf\n\n/usr/local/lib64\n")
    (root / "etc/ld.so.conf.d/vendor.conf").write_text("/opt/fakevendor/lib64\n")

    def host(path: Path) -> str:
        return "/" + str(path.relative_to(root))

    return {
        "root": root,
        "libraries": {
            "libcxi.so.1": cxi, "libfakenl-3.so.200": nl, "libfakejson.so.5": lib64 / "libfakejson.so.5",
            "libfabric.so.1": fabric / "lib64/libfabric.so.1", "libfakeatomic.so.1": atomic,
            "libnccl.so.2": nccl_lib, "libnccl-net.so": plugin, "libfakehwloc.so.15": hwloc,
            "libfakeudev.so.1": udev, "fi_info": fi_info,
        },
        "closure": {
            "libfakejson.so.5": (host(lib64 / "libfakejson.so.5"), "libfabric.so.1"),
            "libfakeatomic.so.1": (host(atomic), "libfabric.so.1"),
            "libfakehwloc.so.15": (host(hwloc), "libnccl-net.so"),
            "libfakenl-3.so.200": (host(nl), "libcxi.so.1"),
            "libfakeudev.so.1": (host(udev), "libfakehwloc.so.15"),
        },
    }


def bind_into(container_root: Path, apptainer_bind: str) -> None:
    """Copy each src:dst of an APPTAINER_BIND value to container_root/dst, as the mount would show it:
    a directory with its links kept, a file through its links (mount(2) follows a symlinked source)."""
    for entry in (e for e in apptainer_bind.split(",") if e):
        source, target = entry.split(":")[:2]
        destination = container_root / target.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(source):
            shutil.copytree(source, destination, symlinks=True)
        else:
            shutil.copy2(source, destination)


def write_minimal_elf(path: Path, elf_class: int = 64, byte_order: str = "<", machine: int = 62,
                      soname: str | None = None, needed=(), rpath=(), runpath=()) -> Path:
    """A shared object with only what ld.so reads (gABI layout): ELF header, a PT_LOAD
    and a PT_DYNAMIC program header, the dynamic section and its string table.
    For the classes and byte orders cc cannot build here (32-bit, big endian)."""
    import struct

    word = "I" if elf_class == 32 else "Q"
    strings = bytearray(b"\0")

    def add(text: str) -> int:
        strings.extend(text.encode() + b"\0")
        return len(strings) - len(text) - 1

    dynamic = [(1, add(n)) for n in needed]
    if soname:
        dynamic.append((14, add(soname)))
    if rpath:
        dynamic.append((15, add(":".join(rpath))))
    if runpath:
        dynamic.append((29, add(":".join(runpath))))
    header_size = 52 if elf_class == 32 else 64
    phentsize = 32 if elf_class == 32 else 56
    dyn_entry = struct.calcsize(byte_order + ("iI" if elf_class == 32 else "qQ"))
    dynamic_offset = header_size + 2 * phentsize
    strtab_offset = dynamic_offset + (len(dynamic) + 3) * dyn_entry
    vaddr = 0x10000  # a non-zero load address, so the parser must map DT_STRTAB through PT_LOAD
    dynamic += [(5, vaddr + strtab_offset), (10, len(strings)), (0, 0)]
    total = strtab_offset + len(strings)
    ident = b"\x7fELF" + bytes([1 if elf_class == 32 else 2, 1 if byte_order == "<" else 2, 1, 0]) + bytes(8)
    header = struct.pack(byte_order + "HHI" + word * 3 + "IHHHHHH", 3, machine, 1, 0, header_size, 0, 0,
                         header_size, phentsize, 2, 0, 0, 0)

    def phdr(kind: int, offset: int, address: int, size: int) -> bytes:
        if elf_class == 32:
            return struct.pack(byte_order + "IIIIIIII", kind, offset, address, address, size, size, 4, 4)
        return struct.pack(byte_order + "IIQQQQQQ", kind, 4, offset, address, address, size, size, 8)

    body = phdr(1, 0, vaddr, total) + phdr(2, dynamic_offset, vaddr + dynamic_offset, (len(dynamic)) * dyn_entry)
    entries = b"".join(struct.pack(byte_order + ("iI" if elf_class == 32 else "qQ"), t, v) for t, v in dynamic)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(ident + header + body + entries + bytes(strings))
    return path
