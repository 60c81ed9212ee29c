"""Read the dynamic section of an ELF shared object: DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH.

Runs on the HOST (`ddp-launch binds`), where python3 may be 3.6 (SLES 15) and
binutils may be missing, so it parses the file with `struct` instead of calling
readelf; ldd is not an option either, because it may execute the library's code.
The layout is the System V gABI's (Elf32/Elf64 header, program headers, Dyn).
"""

import struct
from typing import NamedTuple, Optional, Tuple

ELF_MAGIC = b"\x7fELF"
_CLASSES = {1: 32, 2: 64}          # EI_CLASS: ELFCLASS32, ELFCLASS64
_BYTE_ORDERS = {1: "<", 2: ">"}    # EI_DATA: ELFDATA2LSB, ELFDATA2MSB
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
_MAX_STRTAB = 64 * 1024 * 1024     # a corrupt DT_STRSZ must not make us read gigabytes


class ElfError(ValueError):
    """The file starts like ELF but its headers do not hold together."""


# typing.NamedTuple, not a dataclass: dataclasses are Python 3.7+, and this
# module runs on the 3.6 python3 of SLES 15 login and batch nodes.
class ElfInfo(NamedTuple):
    """What the dynamic loader reads from one object, plus what makes two objects compatible."""

    elf_class: int                 # 32 or 64
    byte_order: str                # "<" little endian, ">" big endian
    machine: int                   # e_machine (62 x86-64, 183 AArch64, ...)
    soname: Optional[str]
    needed: Tuple[str, ...]
    rpath: Tuple[str, ...]         # DT_RPATH entries, in order (":"-separated in the file)
    runpath: Tuple[str, ...]       # DT_RUNPATH entries

    def compatible(self, other: "ElfInfo") -> bool:
        """ld.so skips a candidate of another class, byte order or machine and keeps searching."""
        return (self.elf_class, self.byte_order, self.machine) == (other.elf_class, other.byte_order, other.machine)


class _Layout(NamedTuple):
    header: str      # e_type .. e_shstrndx, after e_ident
    phdr: str
    dyn: str
    phdr_fields: Tuple[str, ...]


_LAYOUTS = {
    32: _Layout("HHIIIIIHHHHHH", "IIIIIIII", "iI",
                ("type", "offset", "vaddr", "paddr", "filesz", "memsz", "flags", "align")),
    64: _Layout("HHIQQQIHHHHHH", "IIQQQQQQ", "qQ",
                ("type", "flags", "offset", "vaddr", "paddr", "filesz", "memsz", "align")),
}


def read_elf(path: str) -> Optional[ElfInfo]:
    """ElfInfo for an ELF file; None for anything else (a linker script named libc.so, text).

    OSError when the file cannot be read; ElfError when it is ELF but malformed.
    """
    with open(path, "rb") as handle:
        ident = handle.read(16)
        if len(ident) < 16 or ident[:4] != ELF_MAGIC:
            return None
        elf_class, order = _CLASSES.get(ident[4]), _BYTE_ORDERS.get(ident[5])
        if elf_class is None or order is None:
            raise ElfError(f"{path}: unknown ELF class {ident[4]} or byte order {ident[5]}")
        layout = _LAYOUTS[elf_class]
        header = _unpack(handle, order + layout.header, 16, path, "ELF header")
        machine, phoff, phentsize, phnum = header[1], header[4], header[8], header[9]
        segments = []
        for index in range(phnum):
            values = _unpack(handle, order + layout.phdr, phoff + index * phentsize, path, "program header")
            segments.append(dict(zip(layout.phdr_fields, values)))
        dynamic = [s for s in segments if s["type"] == PT_DYNAMIC]
        if not dynamic:  # statically linked, or not a loadable object: needs nothing
            return ElfInfo(elf_class, order, machine, None, (), (), ())
        entries = _dynamic_entries(handle, order + layout.dyn, dynamic[0], path)
        strtab_address = _first(entries, DT_STRTAB)
        strtab_size = _first(entries, DT_STRSZ)
        if strtab_address is None or strtab_size is None:
            raise ElfError(f"{path}: dynamic section without DT_STRTAB/DT_STRSZ")
        handle.seek(_file_offset(segments, strtab_address, path))
        strtab = handle.read(min(strtab_size, _MAX_STRTAB))

    def text(offset: int) -> str:
        if offset >= len(strtab):
            raise ElfError(f"{path}: string offset {offset} past the string table")
        end = strtab.find(b"\0", offset)
        return strtab[offset:end if end >= 0 else len(strtab)].decode("utf-8", "replace")

    def paths(tag: int) -> Tuple[str, ...]:
        return tuple(p for value in entries if value[0] == tag for p in text(value[1]).split(":") if p)

    soname_offset = _first(entries, DT_SONAME)
    return ElfInfo(
        elf_class=elf_class,
        byte_order=order,
        machine=machine,
        soname=text(soname_offset) if soname_offset is not None else None,
        needed=tuple(text(value) for tag, value in entries if tag == DT_NEEDED),
        rpath=paths(DT_RPATH),
        runpath=paths(DT_RUNPATH),
    )


def _unpack(handle, fmt: str, offset: int, path: str, what: str) -> tuple:
    size = struct.calcsize(fmt)
    handle.seek(offset)
    data = handle.read(size)
    if len(data) != size:
        raise ElfError(f"{path}: truncated {what} at offset {offset}")
    return struct.unpack(fmt, data)


def _dynamic_entries(handle, fmt: str, segment: dict, path: str) -> Tuple[Tuple[int, int], ...]:
    size = struct.calcsize(fmt)
    handle.seek(segment["offset"])
    data = handle.read(segment["filesz"])
    entries = []
    for start in range(0, len(data) - size + 1, size):
        tag, value = struct.unpack(fmt, data[start:start + size])
        if tag == DT_NULL:
            break
        entries.append((tag, value))
    return tuple(entries)


def _first(entries: Tuple[Tuple[int, int], ...], tag: int) -> Optional[int]:
    return next((value for entry_tag, value in entries if entry_tag == tag), None)


def _file_offset(segments, address: int, path: str) -> int:
    """DT_STRTAB is a virtual address: map it through the PT_LOAD segment that holds it."""
    for segment in segments:
        if segment["type"] == PT_LOAD and segment["vaddr"] <= address < segment["vaddr"] + segment["filesz"]:
            return address - segment["vaddr"] + segment["offset"]
    raise ElfError(f"{path}: DT_STRTAB address {address:#x} is in no PT_LOAD segment")
