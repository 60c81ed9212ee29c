"""make's virtual environments, built in steps that each say what they do and how long they took.

  python3 tools/make_venv.py full VENV   `make venv`, for the tests and benchmarks: PyTorch's default
                                         build (on Linux the CUDA one: Triton, NCCL and the CUDA
                                         libraries the tests read)
  python3 tools/make_venv.py demo VENV   `make demo`: what the CPU demo needs and no more. With no NVIDIA
                                         GPU here, PyTorch's CPU-only build from PyTorch's own index,
                                         which carries no CUDA libraries; where that index cannot be
                                         reached, the default build, said in one line. A venv that
                                         `make venv` built serves as it is.
  --dry-run                              print the steps, run nothing

Every pip call goes through the configuration pip already has (pip config list: its indexes, mirrors,
constraints, CA bundle): the CPU-only index is added for the two PyTorch packages only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

TORCH_PINS = ("torch==2.14.1", "torchvision==0.29.1")
# The index of "pip3 install torch torchvision --index-url https://download.pytorch.org/whl/cpu", the
# CPU-only install of https://pytorch.org/get-started/locally/ (Linux, Pip, CPU). It is added as an
# extra index, so that pip's own configuration (a mirror, a constraints file) still serves everything
# else. Its Linux wheels carry the local version +cpu, which `torch==2.14.1` admits (a specifier
# without a local label ignores the candidate's, PEP 440, "Version matching") and which PEP 440 orders
# after the plain release, so pip takes the CPU-only wheel over the default index's 2.14.1.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REACH_TIMEOUT_S = 10.0
FULL_EXTRAS, DEMO_EXTRAS = "train,test", "train,plots"
FULL_STAMP, DEMO_STAMP = ".installed", ".demo-installed"


@dataclass(frozen=True)
class Machine:
    """What decides the install: the GPU, whether the CPU-only index answers, what the venv has."""
    nvidia_gpu: bool
    cpu_index: str            # "" when the user turned it off (TORCH_CPU_INDEX=)
    cpu_index_reachable: bool
    full_venv_current: bool   # `make venv` already built this venv from today's pyproject.toml
    torch_build: str          # the torch version the venv has ("" for none), e.g. 2.14.1+cpu


@dataclass(frozen=True)
class Step:
    title: str
    argv: tuple
    long: bool = False        # pip's own progress is shown, not --quiet


@dataclass(frozen=True)
class Plan:
    steps: tuple
    note: str                 # one line on the build chosen and why
    stamp: str


def pip(venv: Path, *args: str) -> tuple:
    return (str(venv / "bin" / "python"), "-m", "pip", *args)


def decide(mode: str, venv: Path, python: str, machine: Machine) -> Plan:
    """The steps that build `venv` for `mode` on `machine` (pure: the facts come in as data)."""
    create = () if (venv / "bin" / "python").exists() else (
        Step(f"creating {venv} with {python}", (python, "-m", "venv", str(venv))),)
    upgrade = Step("upgrading pip", pip(venv, "install", "--quiet", "--upgrade", "pip"))
    default_torch = Step("PyTorch 2.14.1, the default build (on Linux with its CUDA libraries: about 5.6 GB "
                         "installed)", pip(venv, "install", *TORCH_PINS), long=True)
    if mode == "full":
        torch = default_torch
        if torch_is_cpu_only(machine.torch_build):  # a demo's venv: the tests need the default build
            torch = Step(f"PyTorch 2.14.1, the default build, in place of the demo's {machine.torch_build} "
                         "(the tests read its CUDA libraries and run Triton)",
                         pip(venv, "install", "--force-reinstall", *TORCH_PINS), long=True)
        project = Step(f"this project, editable, with its [{FULL_EXTRAS}] extras",
                       pip(venv, "install", "--quiet", "-e", f".[{FULL_EXTRAS}]"))
        return Plan((*create, upgrade, torch, project), "the tests' environment: PyTorch's default build", FULL_STAMP)

    if machine.full_venv_current:
        return Plan((), f"{venv} is the tests' environment (make venv), which has all the demo needs", DEMO_STAMP)
    project = Step(f"this project, editable, with its [{DEMO_EXTRAS}] extras",
                   pip(venv, "install", "--quiet", "-e", f".[{DEMO_EXTRAS}]"))
    if machine.nvidia_gpu:
        return Plan((*create, upgrade, default_torch, project),
                    "an NVIDIA GPU is here: PyTorch's default build, which drives it", DEMO_STAMP)
    if not machine.cpu_index:
        return Plan((*create, upgrade, default_torch, project),
                    "TORCH_CPU_INDEX is empty: PyTorch's default build", DEMO_STAMP)
    if not machine.cpu_index_reachable:
        return Plan((*create, upgrade, default_torch, project),
                    f"no NVIDIA GPU here, but PyTorch's CPU-only index {machine.cpu_index} cannot be reached "
                    "(no route, a proxy, or a mirror only): installing the default build instead, "
                    "CUDA libraries included; TORCH_CPU_INDEX=<a mirror of it> picks another", DEMO_STAMP)
    cpu_torch = Step(f"PyTorch 2.14.1, the CPU-only build from {machine.cpu_index} (no CUDA libraries)",
                     pip(venv, "install", "--extra-index-url", machine.cpu_index, *TORCH_PINS), long=True)
    return Plan((*create, upgrade, cpu_torch, project),
                "no NVIDIA GPU here: PyTorch's CPU-only build, all the CPU demo needs", DEMO_STAMP)


def torch_is_cpu_only(version: str) -> bool:
    return version.endswith("+cpu")


def nvidia_gpu_present(root: Path = Path("/")) -> bool:
    """The NVIDIA kernel driver is loaded (it writes /proc/driver/nvidia/version, NVIDIA's Linux driver
    README, "Installed Components"): the machine has a GPU that PyTorch's CUDA build could use."""
    return (root / "proc" / "driver" / "nvidia" / "version").exists()


def reachable(index: str, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """The index answers for torch's page (PEP 503: <index>/<project>/), through the proxies the
    environment names, as pip's own requests would."""
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=timeout_s) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def installed_torch(venv: Path) -> str:
    python = venv / "bin" / "python"
    if not python.exists():
        return ""
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def current(stamp: Path, project: Path) -> bool:
    return stamp.exists() and stamp.stat().st_mtime >= project.stat().st_mtime


def look(mode: str, venv: Path, env: Mapping[str, str]) -> Machine:
    cpu_index = env.get("TORCH_CPU_INDEX", CPU_INDEX)
    gpu = nvidia_gpu_present()
    full_current = current(venv / FULL_STAMP, Path("pyproject.toml"))
    asks_index = mode == "demo" and not gpu and not full_current and bool(cpu_index)
    return Machine(nvidia_gpu=gpu, cpu_index=cpu_index, cpu_index_reachable=asks_index and reachable(cpu_index),
                   full_venv_current=full_current, torch_build=installed_torch(venv))


def say(line: str) -> None:
    print(f"venv: {line}", flush=True)


def carry_out(plan: Plan, venv: Path) -> int:
    say(plan.note)
    for number, step in enumerate(plan.steps, 1):
        say(f"[{number}/{len(plan.steps)}] {step.title}{' ...' if step.long else ''}")
        started = time.monotonic()
        done = subprocess.run(step.argv)
        if done.returncode != 0:
            say(f"error: step {number} failed (exit {done.returncode}): {shlex.join(step.argv)}")
            return done.returncode
        if step.long:
            say(f"[{number}/{len(plan.steps)}] done in {time.monotonic() - started:.0f} s")
    (venv / plan.stamp).touch()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/make_venv.py", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("full", "demo"))
    parser.add_argument("venv", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    args = parser.parse_args(argv)
    plan = decide(args.mode, args.venv, sys.executable, look(args.mode, args.venv, os.environ))
    if args.dry_run:
        say(plan.note)
        for step in plan.steps:
            print(shlex.join(step.argv))
        return 0
    return carry_out(plan, args.venv)


if __name__ == "__main__":
    sys.exit(main())
