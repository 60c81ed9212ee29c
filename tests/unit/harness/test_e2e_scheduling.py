"""How `make test` deals the e2e tests to its xdist workers (tests/e2e/scheduling.py): a module that
shares a module fixture goes to one worker whole, every other test alone."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import scheduling

E2E = Path(scheduling.__file__).parent


def test_a_twins_tests_share_one_scope_and_a_fault_test_is_a_scope_of_its_own():
    twin = ["tests/e2e/test_twin_lumi.py::test_a", "tests/e2e/test_twin_lumi.py::test_b[x]"]
    faults = ["tests/e2e/test_faults.py::test_a", "tests/e2e/test_faults.py::test_b"]
    assert {scheduling.scope_of(nodeid) for nodeid in twin} == {"tests/e2e/test_twin_lumi.py"}
    assert [scheduling.scope_of(nodeid) for nodeid in faults] == faults


def test_the_listed_modules_are_e2e_modules():
    assert {path.stem for path in E2E.glob("test_*.py")} >= scheduling.MODULES_SHARING_A_FIXTURE


def test_real_xdist_keeps_a_module_that_shares_a_fixture_on_one_worker(tmp_path):
    # The grouping xdist's own loadgroup lost under pytest 9.2 (pytest-dev/pytest-xdist#1386): run
    # for real on two workers, the twin module's tests must all land on one.
    (tmp_path / "conftest.py").write_text(
        "import pytest, scheduling\npytest_xdist_make_scheduler = scheduling.make_scheduler\n"
        "@pytest.fixture(scope='module')\ndef shared():\n    return object()\n")
    (tmp_path / "test_twin_lumi.py").write_text(
        "".join(f"def test_{k}(shared):\n    pass\n" for k in range(4)))
    (tmp_path / "test_faults.py").write_text(
        "import time\n" + "".join(f"def test_{k}():\n    time.sleep(0.3)\n" for k in range(4)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope",
                           "-v", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(E2E)})
    assert done.returncode == 0, done.stdout + done.stderr
    workers = re.findall(r"\[(gw\d)\] .*PASSED test_twin_lumi\.py::", done.stdout)
    assert len(workers) == 4 and len(set(workers)) == 1, done.stdout
