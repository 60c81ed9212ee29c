"""Which e2e tests go to one xdist worker together (conftest.py's pytest_xdist_make_scheduler)."""
from __future__ import annotations

from pathlib import Path

# How `make test` spreads the e2e tests over its workers (pytest-xdist, "Running tests across multiple
# CPUs", https://pytest-xdist.readthedocs.io/en/stable/distribution.html). The tests of a module that
# shares a module-scoped fixture (a twin's cluster and its jobs, the spare tests' reference run) go
# together to one worker, which starts that fixture once; every other test goes alone to whichever
# worker is free, the long ones first (longest-first, so that the workers end together: a worker holds
# a few tests ahead, and a 7-minute test dealt last would run alone). xdist's `--dist loadgroup` would
# say this with marks, but under pytest 9.2 it silently stops grouping (it renames node ids through an
# attribute pytest no longer reads: pytest-dev/pytest-xdist#1386), so the scheduler below keys the
# scope by module, for the modules listed here, and the collection checks the list.
MODULES_SHARING_A_FIXTURE = frozenset({"test_spares", "test_test_world", "test_twin_ethernet", "test_twin_lumi",
                                       "test_twin_olivia", "test_twin_raven", "test_twin_rcp"})


def scope_of(nodeid: str) -> str:
    """What goes to one worker as a whole: the module for the modules that share a fixture, else the test."""
    module = nodeid.split("::", 1)[0]
    return module if Path(module).stem in MODULES_SHARING_A_FIXTURE else nodeid


def make_scheduler(config, log):
    """`--dist loadscope` with scope_of's scopes (xdist's scopes are the modules, which would keep the
    long fault tests of one module on one worker). Units go out largest first, then in collection order."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # only where xdist runs the session

    class ByModuleFixture(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ByModuleFixture(config, log)
