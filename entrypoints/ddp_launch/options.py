"""The user's launcher choices: ddp-launch's flags merged with DDP_LAUNCH_* variables.

Precedence, stated once for every setting: command line > DDP_LAUNCH_* env >
the scheduler's environment (read by each scheduler module) > default.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence

from ddp_contract.place import TRAIN_IN_A_POD, WORDS_TO_THE_ENTRYPOINT, in_a_pod
from ddp_launch import __version__
from ddp_launch.envvars import Setting, first_set, integer, port
from ddp_launch.errors import LaunchError
from ddp_launch.flags import FlagParser
from ddp_launch.launch_options import DEFAULT_DNS_TIMEOUT_S, DEFAULT_MODULE, LaunchOptions, Workload
from ddp_launch.schedulers import help_text, modes

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


USAGE = "ddp-launch [options] [-- workload arguments]\n       ddp-launch doctor|binds|preflight [...]"


def mode_lines(modes: Mapping[str, str]) -> str:
    """The help's modes, each scheduler module's own words (schedulers.modes()), in detection order."""
    lines = []
    for mode, text in modes.items():
        first, *more = text.splitlines()
        lines += [f"  {mode:<11} {first}", *(f"  {'':<11} {line}" for line in more)]
    return "\n".join(lines)


def epilog() -> str:
    """The help's closing text: the modes, the precedence, each scheduler's own paragraph."""
    return "modes (auto detection, in this order):\n" + mode_lines(modes()) + """

precedence: command line > DDP_LAUNCH_* environment > scheduler environment > default
  DDP_LAUNCH_MODE, DDP_LAUNCH_RDZV_HOST, DDP_LAUNCH_RDZV_PORT, DDP_LAUNCH_SITE,
  DDP_LAUNCH_CPU_WORKERS, DDP_LAUNCH_MAX_RESTARTS, DDP_LAUNCH_RDZV_TIMEOUT (s, default 600),
  DDP_LAUNCH_DNS_TIMEOUT (s, default 120)

""" + help_text() + """

everything after -- goes to the workload unchanged (default workload: python -m ddp_train);
your own script or module with --script PATH or --module MOD: its arguments are exactly those
after --, and it gets DDP_RUN_DIR, DDP_DATA_DIR and ranks that agree in torch's and SLURM's
variables (docs/own-script.md in the repository)
"""


def positive_int(name: str, value: object, minimum: int = 1) -> int:
    return integer(name, value, minimum, expected="an integer >= 0" if minimum == 0 else None,
                   fix="fix the value")


def _pick(cli_value: object, flag: str, env: Mapping[str, str], key: str) -> Setting | None:
    """The flag's value, else the DDP_LAUNCH_* variable's: the first two steps of the precedence."""
    if cli_value is not None:
        return Setting(cli_value, flag)
    return first_set(env, (ENV_OVERRIDES[key],))


def merge_options(args: object, workload_args: tuple[str, ...], env: Mapping[str, str]) -> LaunchOptions:
    """LaunchOptions from parsed flags (an argparse Namespace) and the environment."""
    get = args.__dict__.get
    if get("json") and not get("dry_run"):
        raise LaunchError("--json only changes how --dry-run prints the plan: add --dry-run or drop --json")

    mode = _pick(get("mode"), "--mode", env, "mode")
    mode_value = str(mode.value) if mode else "auto"
    if mode_value != "auto" and mode_value not in modes():
        raise LaunchError(f"{mode.source}={mode_value!r} is not a mode: choose one of {', '.join(['auto', *modes()])}")

    cpu = _pick(get("cpu_workers"), "--cpu-workers", env, "cpu_workers")
    if cpu:
        cpu = Setting(positive_int(cpu.source, cpu.value), cpu.source)
    nproc = get("nproc_per_node")
    if nproc is not None:
        nproc = positive_int("--nproc-per-node", nproc)
        if cpu and cpu.source == "--cpu-workers":
            raise LaunchError("--nproc-per-node and --cpu-workers both set the workers per node: give one")
        cpu = None  # a flag beats DDP_LAUNCH_CPU_WORKERS

    rdzv_port = _pick(get("rdzv_port"), "--rdzv-port", env, "rdzv_port")
    if rdzv_port:
        rdzv_port = Setting(port(rdzv_port.source, rdzv_port.value), rdzv_port.source)
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
        rdzv_port=rdzv_port,
        max_restarts=restarts,
        rdzv_timeout=rdzv_timeout,
        log_dir=get("log_dir"),
        site=str(site.value) if site else None,
        nccl_debug=get("nccl_debug"),
        require_fabric=bool(get("require_fabric")),
        dns_timeout_s=dns_timeout,
        dry_run=bool(get("dry_run")),
        json=bool(get("json")),
    )


def _help_formatter(prog: str) -> argparse.HelpFormatter:
    # A fixed width: argparse otherwise measures the terminal with shutil, which imports
    # bz2, lzma and zlib, on every add_argument and not only for --help: 4.3 ms of every
    # launch (benchmarks/launch_overhead.py, 80 interleaved runs, 2-core VM).
    return argparse.RawDescriptionHelpFormatter(prog, width=100)


WORKLOAD_HINT = "put workload arguments after --"


def build_parser(hint: str = WORKLOAD_HINT) -> argparse.ArgumentParser:
    """ddp-launch's flags; hint: what an unknown word's error adds (in a pod, where RunAI's words went)."""
    parser = FlagParser(prog="ddp-launch", usage=USAGE, epilog=epilog(), hint=hint,
                        formatter_class=_help_formatter,
                        description="Turn a scheduler's environment into a correct torchrun launch.")
    add = parser.add_argument
    add("--mode", help=f"auto (default), {', '.join(modes())}")
    add("--nodes", metavar="N", help="expected node count; an error if the scheduler disagrees")
    add("--nproc-per-node", metavar="N", help="workers per node (default: GPUs on the node)")
    add("--cpu-workers", metavar="N", help="N CPU workers per node with gloo (GPUs hidden)")
    add("--rdzv-host", metavar="H", help="rendezvous host (default: the head node / master)")
    add("--rdzv-port", metavar="P", help="rendezvous port (default: derived from the job id)")
    add("--max-restarts", metavar="N", help="torchrun worker-group restarts (default 0)")
    add("--rdzv-timeout", metavar="S", help="seconds to wait for every node to join (torchrun: 600)")
    add("--log-dir", metavar="DIR", help="torchrun's per-worker log directory")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--module", metavar="MOD", help="run python -m MOD (default ddp_train)")
    workload.add_argument("--script", metavar="PATH", help="run the Python file PATH instead")
    add("--site", metavar="NAME", help="site profile for fabric settings (default: detect)")
    add("--nccl-debug", metavar="LEVEL", help="set NCCL_DEBUG (e.g. INFO) for this run")
    add("--require-fabric", action="store_true", help="fail if the fast interconnect is not usable")
    add("--dry-run", action="store_true", help="print the plan and exit")
    add("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    add("--version", action="version", version=f"ddp-launch {__version__}")
    return parser


def split_workload(argv: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """Launcher flags before the first '--', workload arguments (untouched) after it."""
    if "--" in argv:
        cut = list(argv).index("--")
        return list(argv[:cut]), tuple(argv[cut + 1:])
    return list(argv), ()


def command_given_to_the_entrypoint(launcher_argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The error for a command (not a flag) handed to ddp-launch in a pod, where RunAI put it.

    The image's ENTRYPOINT is ddp-launch; a pod's command line is ENTRYPOINT + args unless
    the command is overridden (Kubernetes, "Define a Command and Arguments for a Container":
    args alone keep the image's ENTRYPOINT), and RunAI passes what follows `--` as args
    unless --command is given (Run:ai CLI reference, runai submit-dist pytorch, --command).
    KUBERNETES_SERVICE_HOST is set in every pod (ddp_contract.place).
    """
    if not launcher_argv or launcher_argv[0].startswith("-") or not in_a_pod(env):
        return None
    command = shlex.join(launcher_argv)
    return (f"`{command}` reached ddp-launch, the image's ENTRYPOINT, as its arguments: to run it in the pod "
            f"add RunAI's --command (runai submit-dist pytorch ... --command -- {command}); "
            f"{TRAIN_IN_A_POD}")


def read_options(argv: Sequence[str], env: Mapping[str, str]) -> LaunchOptions:
    """ddp-launch's argv (without the program name) and environment as LaunchOptions."""
    launcher_argv, workload_args = split_workload(argv)
    problem = command_given_to_the_entrypoint(launcher_argv, env)
    if problem:
        raise LaunchError(problem)
    parser = build_parser(WORDS_TO_THE_ENTRYPOINT if in_a_pod(env) else WORKLOAD_HINT)
    return merge_options(parser.parse_args(launcher_argv), workload_args, env)
