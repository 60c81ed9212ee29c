"""What one launch was asked to do: the workload and the launcher's settings, as plain data.

Apart from options.py, which builds it from flags and DDP_LAUNCH_* variables, so that the
scheduler modules can take it without importing the parser (which lists their modes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_launch.envvars import Setting

DEFAULT_MODULE = "ddp_train"
DEFAULT_DNS_TIMEOUT_S = 120.0

# Every worker runs through this module: it dies with its launcher (worker.py).
WORKER_MODULE = "ddp_launch.worker"


@dataclass(frozen=True)
class Workload:
    """What the workers run: a module (python -m MOD) or a Python file, plus its arguments."""

    module: str | None = DEFAULT_MODULE
    script: str | None = None
    args: tuple[str, ...] = ()

    @property
    def is_ours(self) -> bool:
        """The built-in trainer or one of its modules (the fabric gate): code that reads this project's
        variables (DDP_TASK_DEVICE, the heartbeat) itself. Anything else is the user's workload."""
        return self.script is None and (self.module == DEFAULT_MODULE or str(self.module).startswith(DEFAULT_MODULE + "."))

    def describe(self) -> str:
        """How --help and the messages name it: `--script train.py`, `--module pkg.train`."""
        return f"--script {self.script}" if self.script is not None else f"--module {self.module}"

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
    dry_run: bool = False           # print the plan instead of running it
    json: bool = False              # with dry_run: print it as JSON
