"""The user's launcher choices: command-line flags merged with DDP_LAUNCH_* variables.

Precedence, stated once for every setting: command line > DDP_LAUNCH_* env >
the scheduler's environment (read by each scheduler module) > default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ddp_launch.errors import LaunchError
from ddp_launch.rendezvous import parse_port

MODES = ("auto", "slurm-node", "slurm-task", "kubeflow", "torchrun", "local")
DEFAULT_MODULE = "ddp_train"
DEFAULT_DNS_TIMEOUT_S = 120.0

# Launcher settings that may also come from the environment (a site profile or
# a job script sets them once; a flag on one run still wins).
ENV_OVERRIDES = {
    "mode": "DDP_LAUNCH_MODE",
    "rdzv_host": "DDP_LAUNCH_RDZV_HOST",
    "rdzv_port": "DDP_LAUNCH_RDZV_PORT",
    "site": "DDP_LAUNCH_SITE",
    "cpu_workers": "DDP_LAUNCH_CPU_WORKERS",
    "max_restarts": "DDP_LAUNCH_MAX_RESTARTS",
    "dns_timeout": "DDP_LAUNCH_DNS_TIMEOUT",
    "rdzv_timeout": "DDP_LAUNCH_RDZV_TIMEOUT",
}


# Every worker runs through this module: it dies with its launcher (worker.py).
WORKER_MODULE = "ddp_launch.worker"


@dataclass(frozen=True)
class Workload:
    """What the workers run: a module (python -m MOD) or a Python file, plus its arguments."""

    module: str | None = DEFAULT_MODULE
    script: str | None = None
    args: tuple[str, ...] = ()

    def _wrapped(self) -> tuple[str, ...]:
        """ddp_launch.worker's arguments: the python command line's own (-m MOD | SCRIPT) ARGS."""
        if self.script is not None:
            return (WORKER_MODULE, self.script, *self.args)
        return (WORKER_MODULE, "-m", str(self.module), *self.args)

    def direct_argv(self, python: str) -> tuple[str, ...]:
        """The command for one worker started without torchrun."""
        return (python, "-m", *self._wrapped())

    def torchrun_args(self) -> tuple[str, ...]:
        """The tail of a torchrun command: its -m flag and the wrapped workload."""
        return ("-m", *self._wrapped())


class Setting(NamedTuple):
    """A value and where it came from ('--rdzv-port' or 'DDP_LAUNCH_RDZV_PORT'), for messages.

    Small records are NamedTuples: as immutable as a frozen dataclass and ten
    times cheaper to define, and the launcher's start-up time is measured.
    """

    value: object
    source: str


@dataclass(frozen=True)
class LaunchOptions:
    workload: Workload = Workload()
    mode: str = "auto"
    nodes: int | None = None
    nproc_per_node: int | None = None
    cpu_workers: Setting | None = None
    rdzv_host: Setting | None = None
    rdzv_port: Setting | None = None
    max_restarts: Setting | None = None
    rdzv_timeout: Setting | None = None
    log_dir: str | None = None
    site: str | None = None
    nccl_debug: str | None = None
    require_fabric: bool = False
    dns_timeout_s: float = DEFAULT_DNS_TIMEOUT_S


def positive_int(name: str, value: object, minimum: int = 1) -> int:
    text = str(value).strip()
    if text.isascii() and text.isdigit() and int(text) >= minimum:
        return int(text)
    floor = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    raise LaunchError(f"{name}={value!r} is not {floor}: fix the value")


def _pick(cli_value: object, flag: str, env: Mapping[str, str], key: str) -> Setting | None:
    if cli_value is not None:
        return Setting(cli_value, flag)
    variable = ENV_OVERRIDES[key]
    if env.get(variable, "").strip():
        return Setting(env[variable].strip(), variable)
    return None


def merge_options(args: object, workload_args: tuple[str, ...], env: Mapping[str, str]) -> LaunchOptions:
    """LaunchOptions from parsed flags (an argparse Namespace) and the environment."""
    get = args.__dict__.get
    if get("json") and not get("dry_run"):
        raise LaunchError("--json only changes how --dry-run prints the plan: add --dry-run or drop --json")

    mode = _pick(get("mode"), "--mode", env, "mode")
    mode_value = str(mode.value) if mode else "auto"
    if mode_value not in MODES:
        raise LaunchError(f"{mode.source}={mode_value!r} is not a mode: choose one of {', '.join(MODES)}")

    cpu = _pick(get("cpu_workers"), "--cpu-workers", env, "cpu_workers")
    if cpu:
        cpu = Setting(positive_int(cpu.source, cpu.value), cpu.source)
    nproc = get("nproc_per_node")
    if nproc is not None:
        nproc = positive_int("--nproc-per-node", nproc)
        if cpu and cpu.source == "--cpu-workers":
            raise LaunchError("--nproc-per-node and --cpu-workers both set the workers per node: give one")
        cpu = None  # a flag beats DDP_LAUNCH_CPU_WORKERS

    port = _pick(get("rdzv_port"), "--rdzv-port", env, "rdzv_port")
    if port:
        port = Setting(parse_port(port.source, str(port.value)), port.source)
    restarts = _pick(get("max_restarts"), "--max-restarts", env, "max_restarts")
    if restarts:
        restarts = Setting(positive_int(restarts.source, restarts.value, minimum=0), restarts.source)
    rdzv_timeout = _pick(get("rdzv_timeout"), "--rdzv-timeout", env, "rdzv_timeout")
    if rdzv_timeout:
        rdzv_timeout = Setting(positive_int(rdzv_timeout.source, rdzv_timeout.value), rdzv_timeout.source)
    dns = _pick(None, "", env, "dns_timeout")
    dns_timeout = DEFAULT_DNS_TIMEOUT_S
    if dns:
        dns_timeout = float(positive_int(dns.source, dns.value, minimum=0))
    site = _pick(get("site"), "--site", env, "site")
    nodes = get("nodes")

    module, script = get("module"), get("script")
    workload = Workload(module=None, script=script, args=workload_args) if script else Workload(
        module=module or DEFAULT_MODULE, args=workload_args)
    return LaunchOptions(
        workload=workload,
        mode=mode_value,
        nodes=positive_int("--nodes", nodes) if nodes is not None else None,
        nproc_per_node=nproc,
        cpu_workers=cpu,
        rdzv_host=_pick(get("rdzv_host"), "--rdzv-host", env, "rdzv_host"),
        rdzv_port=port,
        max_restarts=restarts,
        rdzv_timeout=rdzv_timeout,
        log_dir=get("log_dir"),
        site=str(site.value) if site else None,
        nccl_debug=get("nccl_debug"),
        require_fabric=bool(get("require_fabric")),
        dns_timeout_s=dns_timeout,
    )
