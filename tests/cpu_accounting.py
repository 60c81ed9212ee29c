"""What each test costs in CPU-seconds, printed at the end of a pytest run (tests/conftest.py loads it).

pytest's --durations are wall seconds, which on a machine shared with three clusters say more about the
load than about the test. Here every process that runs tests (each xdist worker, or pytest itself) joins a
cgroup of its own (tools/cpu_usage.py), so a test's CPU-seconds include the SLURM jobs it submitted and the
daemons of the clusters it started, and nothing of the tests the other workers run beside it. A worker runs
one test at a time, so the group's reading before and after a phase (set-up, call, teardown) is that
phase's cost. A module- or session-scoped fixture (a twin's cluster and its jobs, the images) is counted
apart, once for each worker that set it up, and not in the test during whose set-up it ran.

The workers send their costs to the controller on their reports (TestReport keeps extra attributes through
xdist's serialization) and their totals in workeroutput (pytest-xdist's documented channel); the
controller prints the heaviest at the end and writes them where --cpu-report says (tools/run_tests.py
reads them for `make test`'s closing lines).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import cpu_usage  # tools/cpu_usage.py, on pyproject's pythonpath

WORKER_OUTPUT_KEY = "cpu_accounting"


def pytest_addoption(parser):
    group = parser.getgroup("cpu", "CPU-seconds per test (tests/cpu_accounting.py)")
    group.addoption("--cpu-top", type=int, default=10, metavar="N",
                    help="print the N tests and shared fixtures that took the most CPU-seconds (0: none)")
    group.addoption("--cpu-report", default=None, metavar="PATH", help="write every test's CPU-seconds to PATH (JSON)")


def _is_controller(config) -> bool:
    """pytest-xdist's controller, which runs no test itself."""
    return config.pluginmanager.getplugin("dsession") is not None


def _suite(config) -> str:
    paths = {Path(a.split("::")[0]).parts[:2] for a in config.args} or {("tests",)}
    return "/".join(paths.pop()) if len(paths) == 1 else "tests"


class CpuAccounting:
    def __init__(self, config):
        self.config = config
        self.meter = None
        self.started = 0.0
        # In the process that runs tests: the current phase's shared-fixture cost, and the open fixtures.
        self.shared_cpu = self.shared_wall = 0.0
        self.fixture_costs: list = []
        self.stack: list = []
        self.tearing: dict = {}
        # In the process that reports: every cost, and each worker's total.
        self.costs: list = []
        self.totals: list = []
        self.source = ""

    def _now(self) -> tuple:
        return self.meter.read(), time.monotonic()

    # -- the processes that run tests ---------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        if _is_controller(self.config):
            return
        worker = getattr(self.config, "workerinput", {}).get("workerid", "main")
        self.meter = cpu_usage.meter(f"pytest-{worker}")
        self.started = self.meter.read()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        if self.meter is not None:
            total = self.meter.read() - self.started
            self.meter.close()
            if hasattr(self.config, "workeroutput"):
                self.config.workeroutput[WORKER_OUTPUT_KEY] = {"total_s": total, "source": self.meter.source}
            else:
                self.totals.append(total)
                self.source = self.meter.source
            self.meter = None
        path = self.config.getoption("cpu_report")
        if path and not hasattr(self.config, "workerinput"):
            cpu_usage.write_ledger(Path(path), self.ledger())

    def _phase(self, item, when):
        if self.meter is None:
            yield
            return
        self.shared_cpu = self.shared_wall = 0.0
        self.fixture_costs = []
        start = self._now()
        yield
        end = self._now()
        phases = item.__dict__.setdefault("_cpu_phases", {})
        phases[when] = (end[0] - start[0] - self.shared_cpu, end[1] - start[1] - self.shared_wall,
                        self.fixture_costs)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._phase(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._phase(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._phase(item, "teardown")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if self.meter is None or fixturedef.scope == "function":
            yield
            return
        frame = [*self._now(), 0.0, 0.0]    # cpu, wall at the start; what fixtures inside it took
        self.stack.append(frame)
        yield
        self.stack.pop()
        cpu, wall = self._now()
        cpu, wall = cpu - frame[0], wall - frame[1]
        self._shared(cpu, wall)
        where = getattr(request.node, "nodeid", "")
        self.fixture_costs.append((cpu_usage.fixture_name(fixturedef.argname, where), cpu - frame[2], wall - frame[3]))
        # Run first of its finalizers (they run last-in first-out; pytest_fixture_post_finalizer's runs
        # last): the fixture's teardown lies between the two.
        fixturedef.addfinalizer(lambda: self.tearing.__setitem__(id(fixturedef), (where, self._now())))

    def _shared(self, cpu: float, wall: float) -> None:
        if self.stack:
            self.stack[-1][2] += cpu
            self.stack[-1][3] += wall
        else:
            self.shared_cpu += cpu
            self.shared_wall += wall

    def pytest_fixture_post_finalizer(self, fixturedef, request):
        begun = self.tearing.pop(id(fixturedef), None)
        if begun is None or self.meter is None:
            return
        where, start = begun
        end = self._now()
        cpu, wall = end[0] - start[0], end[1] - start[1]
        self._shared(cpu, wall)
        self.fixture_costs.append((cpu_usage.fixture_name(fixturedef.argname, where), cpu, wall))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        phase = item.__dict__.get("_cpu_phases", {}).pop(call.when, None)
        if phase is not None:
            report = outcome.get_result()
            report.cpu_s, report.cpu_wall_s = phase[0], phase[1]
            report.cpu_fixtures = [list(cost) for cost in phase[2]]

    # -- the process that reports -----------------------------------------------------------------------

    def pytest_runtest_logreport(self, report):
        cpu = getattr(report, "cpu_s", None)
        if cpu is None:
            return
        self.costs.append(cpu_usage.Cost("test", report.nodeid, cpu, report.cpu_wall_s))
        self.costs += [cpu_usage.Cost("fixture", name, c, w) for name, c, w in getattr(report, "cpu_fixtures", [])]

    def pytest_testnodedown(self, node, error):
        output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
        if output:
            self.totals.append(output["total_s"])
            self.source = output["source"]

    def ledger(self) -> cpu_usage.Ledger:
        return cpu_usage.Ledger(_suite(self.config), tuple(cpu_usage.merged(self.costs)), sum(self.totals),
                                self.source)

    def pytest_terminal_summary(self, terminalreporter):
        count = self.config.getoption("cpu_top")
        if count <= 0 or not self.costs:
            return
        import_s = float(os.environ.get("DDP_TORCH_IMPORT_CPU_S", "0") or 0) or None
        for line in cpu_usage.ledger_lines(self.ledger(), count, import_s):
            terminalreporter.write_line(line)
