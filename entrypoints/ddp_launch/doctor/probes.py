"""Where the doctor touches the world: commands, dlopen, torch, sockets, and the files of /proc,
/sys and the library directories. The checks decide on what these return.

Probes carries what a test fakes by hand (a command's answer, a dlopen, torch, a TCP connect);
the readers below it take the probe root instead, which a test fills with a fake /sys, /dev tree.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from ddp_launch.accelerators import Accelerator
from ddp_launch.doctor.image_mount import CONTAINER_VARIABLES, RUNTIME_PARENT, ImageMountFacts
from ddp_launch.facts import list_dir, read_text, under
from ddp_launch.libload import load_in_child

# nvidia-smi -q on an 8-GPU node takes seconds; one that hangs is itself a sick node.
HEALTH_TIMEOUT_S = 120


def real_filesystem_bytes(path: str) -> Optional[int]:
    """The size of the filesystem at path (statvfs), or None when it cannot be read."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def real_read_command(argv: Sequence[str]) -> Tuple[int, str, str]:
    """(exit status, stdout, stderr); 127 when it cannot start, 124 when it runs past HEALTH_TIMEOUT_S."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=HEALTH_TIMEOUT_S, check=False)
    except OSError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer within {HEALTH_TIMEOUT_S} s"
    return done.returncode, done.stdout, done.stderr


@dataclass(frozen=True)
class Probes:
    torch_info: Callable[[], Optional[Dict[str, object]]]
    load_library: Callable[[str, str], str]            # (path, kind) -> version text; raises OSError
    run_command: Callable[[Sequence[str]], Tuple[int, str]]
    connect: Callable[[str, int, float], str]           # "open" | "refused" | "timeout" | "error: ..."
    which: Callable[[str], Optional[str]] = shutil.which
    # (paths, LD_LIBRARY_PATH) -> ((path, dlopen error or ""), ...), in a fresh process
    load_in_child: Callable[[Sequence[str], str], Tuple[Tuple[str, str], ...]] = load_in_child
    filesystem_bytes: Callable[[str], Optional[int]] = real_filesystem_bytes
    read_command: Callable[[Sequence[str]], Tuple[int, str, str]] = real_read_command  # the GPU health tool
    sleep: Callable[[float], None] = time.sleep         # between two readings of the GPU health tool


@functools.lru_cache(maxsize=1)
def real_torch_info() -> Optional[Dict[str, object]]:
    try:
        import torch  # noqa: PLC0415 - optional, and slow: only when doctor runs
    except Exception:  # a broken install raises more than ImportError
        return None
    info: Dict[str, object] = {"version": torch.__version__, "cuda": torch.version.cuda,
                               "hip": getattr(torch.version, "hip", None)}
    try:
        info["cuda_device_count"] = torch.cuda.device_count()
        if torch.cuda.is_available():
            info["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception as exc:  # CUDA init errors are themselves the finding
        info["cuda_error"] = str(exc)
    return info


def real_load_library(path: str, kind: str) -> str:
    """dlopen with RTLD_GLOBAL so later libraries (the plugin) find earlier ones by soname."""
    library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    symbol = {"libfabric": "fi_version", "nccl": "ncclGetVersion"}.get(kind)
    if symbol is not None and not hasattr(library, symbol):
        # It loads, but it is not the library its name promises (a stub, a wrong build).
        return f"version unknown: no {symbol} in it"
    if kind == "libfabric":
        library.fi_version.restype = ctypes.c_uint32
        value = library.fi_version()
        return f"libfabric {value >> 16}.{value & 0xFFFF}"
    if kind == "nccl":
        number = ctypes.c_int()
        if library.ncclGetVersion(ctypes.byref(number)) == 0:
            code = number.value
            major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
            return f"NCCL {major}.{rest // 100}.{rest % 100}"
    return ""


def real_run_command(argv: Sequence[str]) -> Tuple[int, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, done.stdout + done.stderr


def real_connect(address: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return f"error: {exc}"


REAL_PROBES = Probes(real_torch_info, real_load_library, real_run_command, real_connect)


def run_fresh_interpreter(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """argv in a new process with env, its output captured; raises OSError, subprocess.TimeoutExpired."""
    return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout_s)


# -- readers under the probe root ---------------------------------------------------------

def driver_version_text(root: str, accelerator: Accelerator) -> str:
    """The vendor's kernel driver version file (/proc/driver/nvidia/version, /sys/module/amdgpu/version)."""
    return read_text(root, accelerator.driver_version_file) or ""


def find_files(root: str, dirs: Sequence[str], pattern: str) -> Tuple[str, ...]:
    """The files in dirs whose names match pattern whole, directory by directory."""
    regex = re.compile(pattern)
    hits = []
    for directory in dirs:
        for name in list_dir(root, directory) or ():
            if regex.fullmatch(name):
                hits.append(os.path.join(directory, name))
    return tuple(hits)


def distinct_files(root: str, paths: Sequence[str]) -> Tuple[str, ...]:
    """paths less those naming a file named before: a merged-/usr image (Ubuntu's, NGC's, LUMI's)
    has /lib -> usr/lib and /lib64 -> usr/lib64, so ld.so's search meets one file under two
    names, and it is one library, not one shadowing another."""
    seen: set = set()
    kept = []
    for path in paths:
        real = os.path.realpath(under(root, path))
        if real not in seen:
            seen.add(real)
            kept.append(path)
    return tuple(kept)


def shared_objects(root: str, groups: Sequence[Tuple[str, Sequence[str]]]) -> Tuple[Tuple[str, str], ...]:
    """(container path, group) of each shared object in each group's directories, each file once."""
    found, seen = [], set()
    for group, directories in groups:
        for directory in directories:
            for name in list_dir(root, directory) or ():
                path = os.path.join(directory, name)
                real = os.path.realpath(under(root, path))
                if (name.endswith(".so") or ".so." in name) and os.path.isfile(real) and real not in seen:
                    seen.add(real)
                    found.append((path, group))
    return tuple(found)


def is_executable_file(path: str) -> bool:
    return os.access(path, os.X_OK) and os.path.isfile(path)


# -- how Apptainer mounted the image (ddp_launch.doctor.image_mount decides on it) ----------

def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _parent(pid: str, proc: str = "/proc") -> Optional[str]:
    status = _read(f"{proc}/{pid}/status") or b""
    for line in status.decode(errors="replace").splitlines():
        if line.startswith("PPid:"):
            return line.split()[1]
    return None


def read_image_mount(env: Mapping[str, str], proc: str = "/proc", sys_block: str = "/sys/block") -> ImageMountFacts:
    image = next((env[name] for name in CONTAINER_VARIABLES if env.get(name)), None)
    ancestors, pid = set(), str(os.getpid())
    runtime_parent = False
    for _ in range(64):
        pid = _parent(pid, proc)
        if pid is None or pid == "0":
            break
        cmdline = (_read(f"{proc}/{pid}/cmdline") or b"").decode(errors="replace")
        if cmdline.startswith(RUNTIME_PARENT):
            runtime_parent = True
            ancestors.add(pid)
    children = 0
    if ancestors:
        for entry in os.listdir(proc):
            if not entry.isdigit():
                continue
            argv0 = (_read(f"{proc}/{entry}/cmdline") or b"").split(b"\0")[0]
            if os.path.basename(argv0).startswith(b"squashfuse") and _parent(entry, proc) in ancestors:
                children += 1
    backing = []
    for name in sorted(os.listdir(sys_block)) if os.path.isdir(sys_block) else ():
        text = _read(f"{sys_block}/{name}/loop/backing_file")
        if text:
            backing.append(text.decode(errors="replace").strip())
    return ImageMountFacts(image, bool(image) and os.path.isdir(image or ""), runtime_parent, children,
                           tuple(backing))
