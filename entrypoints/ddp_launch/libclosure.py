"""The host libraries that bound host libraries need: resolved as ld.so would, minus what the image provides.

Runs on the HOST inside `ddp-launch binds` (Python 3.6 there, see elf.py), never in
the launch path. Paths are host paths as ld.so sees them; `root` maps them into a
fake tree for tests (sites.host_path).
"""

import fnmatch
import glob
import json
import os
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from ddp_launch.elf import ElfError, ElfInfo, read_elf
from ddp_launch.errors import LaunchError
from ddp_launch.sites import BindSpec, ResolvedBind, SiteProfile, host_path, sites_dirs

IMAGE_LIBRARIES_FILE = os.path.join("image", "provided-libraries.json")
# GNU multiarch triplets by e_machine, for Debian-family hosts (SLES and RHEL use lib64).
_MULTIARCH = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu", 3: "i386-linux-gnu", 21: "powerpc64le-linux-gnu"}
_PLATFORM = {62: "x86_64", 183: "aarch64", 3: "i686", 21: "ppc64le"}


class ImageLibrary(NamedTuple):
    """A soname pattern the image always provides and that must come from the image."""

    pattern: str
    source: str


class SharedObject(NamedTuple):
    path: str            # host path, as ld.so on the host would name it
    info: ElfInfo
    loaders: Tuple["SharedObject", ...] = ()   # who needed it, nearest first (for DT_RPATH)


class AddedLibrary(NamedTuple):
    soname: str
    path: str            # host path
    needed_by: str       # soname (else file name) of the library that first needed it


class MissingLibrary(NamedTuple):
    soname: str
    needed_by: str


class Closure(NamedTuple):
    added: Tuple[AddedLibrary, ...]
    missing: Tuple[MissingLibrary, ...]
    unreadable: Tuple[str, ...]          # "path: why" for bound files that could not be parsed


# --- data ----------------------------------------------------------------------

def load_image_libraries(env: Mapping[str, str]) -> Tuple[ImageLibrary, ...]:
    """The shipped list beside the site profiles; every entry names its source."""
    for directory in sites_dirs(env):
        path = os.path.join(directory, IMAGE_LIBRARIES_FILE)
        if os.path.isfile(path):
            return read_image_libraries(path)
    raise LaunchError(f"{IMAGE_LIBRARIES_FILE} not found beside the site profiles ({', '.join(sites_dirs(env))}); "
                      "restore it from the repository")


def read_image_libraries(path: str) -> Tuple[ImageLibrary, ...]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{path} cannot be read: {exc}; fix the file") from None
    entries = data.get("libraries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and set(e) == {"soname", "source"} and all(isinstance(v, str) and v for v in e.values())
            for e in entries):
        raise LaunchError(f"bad {path}: 'libraries' must be a list of {{\"soname\": pattern, \"source\": why}}")
    return tuple(ImageLibrary(e["soname"], e["source"]) for e in entries)


def provided_by_image(soname: str, image: Sequence[ImageLibrary]) -> bool:
    return any(fnmatch.fnmatchcase(soname, entry.pattern) for entry in image)


# --- ld.so's search, on the host -------------------------------------------------

def ld_so_conf_dirs(root: str, conf: str = "/etc/ld.so.conf", seen: Optional[Set[str]] = None) -> Tuple[str, ...]:
    """Directories of /etc/ld.so.conf and its `include`s (ldconfig(8)), in file order.

    ld.so reads /etc/ld.so.cache, which ldconfig builds from exactly these
    directories; reading the configuration avoids parsing the cache format.
    """
    seen = set() if seen is None else seen
    if conf in seen:
        return ()
    seen.add(conf)
    try:
        with open(host_path(root, conf), encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return ()
    dirs: List[str] = []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("hwcap "):
            continue
        if line.startswith("include ") or line.startswith("include\t"):
            for pattern in line.split()[1:]:
                # A relative include is relative to the including file's directory (ldconfig.c).
                pattern = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(conf), pattern)
                for match in sorted(glob.glob(host_path(root, pattern))):
                    dirs.extend(ld_so_conf_dirs(root, logical_path(root, match), seen))
            continue
        directory = line.split("=", 1)[0].rstrip("/")  # "dir=TYPE" is ldconfig's legacy syntax
        if directory.startswith("/"):
            dirs.append(directory)
    return tuple(dirs)


def default_dirs(info: ElfInfo) -> Tuple[str, ...]:
    """ld.so's trusted directories: /lib64 and /usr/lib64 for 64-bit objects on SLES/RHEL,
    /lib and /usr/lib otherwise, and the multiarch ones where Debian-family hosts keep them."""
    multiarch = _MULTIARCH.get(info.machine)
    debian = (f"/lib/{multiarch}", f"/usr/lib/{multiarch}") if multiarch else ()
    wide = ("/lib64", "/usr/lib64") if info.elf_class == 64 else ()
    return wide + debian + ("/lib", "/usr/lib")


def node_default_dirs(machine: str) -> Tuple[str, ...]:
    """default_dirs for the node's own 64-bit objects, machine as os.uname() names it."""
    e_machine = next((number for number, name in _PLATFORM.items() if name == machine), 0)
    return default_dirs(ElfInfo(32 if machine == "i686" else 64, "<", e_machine, None, (), (), ()))


def expand_dynamic_tokens(entry: str, obj: SharedObject) -> Optional[str]:
    """$ORIGIN, $LIB and $PLATFORM (also ${...}) as ld.so(8) defines them; None for an unknown token."""
    lib = "lib64" if obj.info.elf_class == 64 else "lib"
    values = {"ORIGIN": os.path.dirname(obj.path), "LIB": lib, "PLATFORM": _PLATFORM.get(obj.info.machine, "")}
    for name, value in values.items():
        entry = entry.replace("${" + name + "}", value).replace("$" + name, value)
    return None if "$" in entry else entry


class HostSearch(NamedTuple):
    root: str
    library_path: Tuple[str, ...]        # the job's LD_LIBRARY_PATH (modules set it)
    conf_dirs: Tuple[str, ...]           # /etc/ld.so.conf and includes


def host_search(env: Mapping[str, str], root: str) -> HostSearch:
    library_path = tuple(p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p.startswith("/"))
    return HostSearch(root, library_path, ld_so_conf_dirs(root))


def search_dirs(needer: SharedObject, search: HostSearch) -> Tuple[str, ...]:
    """ld.so(8), "Rpath token expansion" and the search order for a dependency:
    1. DT_RPATH of the object that needs it, then of the objects that loaded that one,
       only when the needing object has no DT_RUNPATH;
    2. LD_LIBRARY_PATH;
    3. DT_RUNPATH of the needing object only;
    4. /etc/ld.so.cache (here: the directories ldconfig builds it from);
    5. the default directories.
    """
    dirs: List[str] = []
    if not needer.info.runpath:
        for obj in (needer,) + needer.loaders:
            dirs.extend(d for d in (expand_dynamic_tokens(e, obj) for e in obj.info.rpath) if d)
    dirs.extend(search.library_path)
    dirs.extend(d for d in (expand_dynamic_tokens(e, needer) for e in needer.info.runpath) if d)
    dirs.extend(search.conf_dirs)
    dirs.extend(default_dirs(needer.info))
    return tuple(dirs)


def resolve_needed(name: str, needer: SharedObject, search: HostSearch) -> Optional[SharedObject]:
    """The first compatible file called name in ld.so's order, or None."""
    candidates = [name] if "/" in name else [os.path.join(d, name) for d in search_dirs(needer, search)]
    for candidate in candidates:
        info = _read(host_path(search.root, candidate))
        if info is not None and info.compatible(needer.info):
            return SharedObject(os.path.normpath(candidate), info, (needer,) + needer.loaders)
    return None


def _read(path: str) -> Optional[ElfInfo]:
    if not os.path.isfile(path):
        return None
    try:
        return read_elf(path)
    except (OSError, ElfError):
        return None


def logical_path(root: str, path: str) -> str:
    """Inverse of sites.host_path: the host path a file under the probe root stands for."""
    if root in ("", "/"):
        return path
    relative = os.path.relpath(path, root)
    if relative == ".":
        return "/"
    return path if relative.startswith("..") else "/" + relative


# --- what the binds bring, and what they need -----------------------------------

def _is_shared_object_name(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def bound_files(binds: Sequence[ResolvedBind], root: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(host paths to scan, names the container will find) for the binds that were found.

    A bind of one file (libcxi.so.1) is scanned itself; a directory bind is scanned in
    the directories of its library_path that lie under its target (the libfabric
    lib64, the NCCL lib dir, the plugin's lib dir). Every file name there, link or
    not, is a name the container's loader finds on LD_LIBRARY_PATH.
    """
    scan: List[str] = []
    names: List[str] = []
    seen_real: Set[str] = set()
    for bind in binds:
        if bind.host is None:
            continue
        if os.path.isfile(bind.host):
            scan.append(logical_path(root, bind.host))
            names.append(os.path.basename(bind.spec.target))
            continue
        for directory in _library_dirs_under(bind.spec, bind.host):
            try:
                entries = sorted(os.listdir(directory))
            except OSError:
                continue
            for entry in entries:
                path = os.path.join(directory, entry)
                if not _is_shared_object_name(entry) or not os.path.isfile(path):
                    continue
                names.append(entry)
                real = os.path.realpath(path)
                if real not in seen_real:
                    seen_real.add(real)
                    scan.append(logical_path(root, path))
    return tuple(scan), tuple(names)


def _library_dirs_under(spec: BindSpec, host: str) -> Tuple[str, ...]:
    prefix = spec.target.rstrip("/") + "/"
    return tuple(os.path.join(host, p[len(prefix):]) for p in spec.library_path if p.startswith(prefix))


def closure(scan: Sequence[str], bound_names: Sequence[str], image: Sequence[ImageLibrary],
            search: HostSearch) -> Closure:
    """Follow DT_NEEDED from the bound files, breadth first, through the host's search.

    A name the binds already carry or the image provides is not added; a library
    that is added is followed in turn. Not found: reported, not fatal (the image
    may carry it under that name).
    """
    known: Set[str] = set(bound_names)
    queue: List[SharedObject] = []
    unreadable: List[str] = []
    for path in scan:
        try:
            info = read_elf(host_path(search.root, path))
        except (OSError, ElfError) as exc:
            unreadable.append(f"{path}: {exc}")
            continue
        if info is not None:
            queue.append(SharedObject(path, info))
            if info.soname:
                known.add(info.soname)
    added: Dict[str, AddedLibrary] = {}
    missing: Dict[str, MissingLibrary] = {}
    while queue:
        obj = queue.pop(0)
        for name in obj.info.needed:
            if name in known or name in missing or provided_by_image(name, image):
                continue
            found = resolve_needed(name, obj, search)
            needer = obj.info.soname or os.path.basename(obj.path)
            if found is None:
                missing[name] = MissingLibrary(name, needer)
                continue
            known.add(name)
            added[name] = AddedLibrary(name, found.path, needer)
            queue.append(found)
    return Closure(tuple(added.values()), tuple(missing.values()), tuple(unreadable))


def closure_binds(profile: SiteProfile, binds: Sequence[ResolvedBind], env: Mapping[str, str],
                  root: str) -> Tuple[Tuple[ResolvedBind, ...], Closure]:
    """The extra single-file binds (host file -> <closure target>/<soname>) and the closure behind them."""
    if profile.closure is None:
        return (), Closure((), (), ())
    scan, names = bound_files(binds, root)
    found = closure(scan, names, load_image_libraries(env), host_search(env, root))
    extra = tuple(
        ResolvedBind(
            BindSpec(name=lib.soname, target=f"{profile.closure.target}/{lib.soname}", source=profile.closure.source),
            host_path(root, lib.path),
            f"needed by {lib.needed_by}",
        )
        for lib in found.added
    )
    return extra, found
