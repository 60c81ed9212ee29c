"""Each test's CPU-seconds (tests/cpu_accounting.py, tools/cpu_usage.py): counted in a cgroup of each
worker's own, so that a process a test starts and does not wait for (a SLURM job under slurmd) is the
test's, a test running beside it on another worker is not, and a shared fixture is counted apart."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cpu_usage  # tools/cpu_usage.py, on pyproject's pythonpath

REPO = Path(__file__).resolve().parents[3]

# proc(5)'s mountinfo lines: a hybrid host (v1 controllers, v2 at /sys/fs/cgroup/unified) and a v2-only one.
HYBRID = ("35 24 0:31 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
          "36 35 0:32 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw\n"
          "38 35 0:34 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct\n")
V2_ONLY = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_v2_hierarchy_is_found_where_it_is_mounted_and_nowhere_on_a_v1_only_host():
    assert cpu_usage.cgroup2_mount(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert cpu_usage.cgroup2_mount(V2_ONLY) == Path("/sys/fs/cgroup")
    assert cpu_usage.cgroup2_mount(HYBRID.splitlines()[2]) is None


def test_the_own_group_is_the_v2_line_of_proc_self_cgroup():
    assert cpu_usage.own_cgroup2("4:memory:/process_api/99\n1:cpu:/\n0::/\n") == "/"
    assert cpu_usage.own_cgroup2("0::/user.slice/user-0.slice/session-3.scope\n") == \
        "/user.slice/user-0.slice/session-3.scope"
    assert cpu_usage.own_cgroup2("1:name=systemd:/\n") is None


def test_cpu_stat_usage_is_read_in_seconds():
    assert cpu_usage.usage_s("usage_usec 1043246\nuser_usec 936314\nsystem_usec 106931\n") == 1.043246
    with pytest.raises(ValueError):
        cpu_usage.usage_s("nr_periods 0\n")


def test_a_ledger_names_the_heaviest_with_the_phases_and_workers_summed_and_round_trips(tmp_path):
    costs = [cpu_usage.Cost("test", "t.py::a", 5.0, 9.0), cpu_usage.Cost("test", "t.py::a", 1.0, 1.0),
             cpu_usage.Cost("fixture", "twin (t.py)", 30.0, 60.0), cpu_usage.Cost("fixture", "twin (t.py)", 20.0, 50.0),
             cpu_usage.Cost("test", "t.py::b", 0.5, 1.0)]
    ledger = cpu_usage.Ledger("tests/e2e", tuple(cpu_usage.merged(costs)), 60.0, "a cgroup")
    assert cpu_usage.ledger_lines(ledger, 2, import_s=2.0) == [
        "cpu: tests/e2e: 60 CPU-s (30 torch imports): tests 6, shared fixtures 50, the rest (start-up, collection) 4; "
        "counted by a cgroup",
        "cpu: tests/e2e: the 2 heaviest, in CPU-s (and wall s):",
        "cpu:     50.0 (   110 s)  fixture twin (t.py)",
        "cpu:      6.0 (    10 s)  t.py::a"]
    cpu_usage.write_ledger(tmp_path / "l.json", ledger)
    assert cpu_usage.read_ledger(tmp_path / "l.json") == ledger
    (tmp_path / "bad.json").write_text("{")
    assert cpu_usage.read_ledger(tmp_path / "bad.json") is None and cpu_usage.read_ledger(tmp_path / "none") is None


# A process that burns one CPU-second and is not waited for (sh starts it in the background and exits),
# as slurmd's jobs are not pytest's children; the test waits for the file it writes when done.
BURN = ("import sys, time\nstart = time.process_time()\nwhile time.process_time() - start < 1.0:\n    pass\n"
        "open(sys.argv[1], 'w').close()\n")
TESTS = f'''
import subprocess, sys, time
from pathlib import Path
import pytest

BURN = {BURN!r}

@pytest.fixture(scope="module")
def shared():
    start = time.process_time()
    while time.process_time() - start < 0.6:
        pass

def test_detached(shared, tmp_path):
    done = tmp_path / "done"
    subprocess.run(["sh", "-c", f'"{{sys.executable}}" -c "$0" "$1" </dev/null >/dev/null 2>&1 &', BURN, str(done)],
                   check=True)
    while not done.exists():
        time.sleep(0.05)

def test_light(shared):
    time.sleep(1.5)  # beside test_detached on the other worker, whose second is not this test's
'''


def test_a_real_xdist_run_charges_each_test_its_detached_processes_and_a_shared_fixture_apart(tmp_path):
    probe = cpu_usage.meter("probe")
    probe.close()
    if isinstance(probe, cpu_usage.RusageMeter):
        pytest.skip("no cgroup v2 can be made here (not root, or /sys/fs/cgroup read-only): getrusage "
                    "cannot see a detached process")
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_work.py").write_text(TESTS)
    report = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-q",
                           f"--cpu-report={report}", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{REPO / 'tools'}"})
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    cpu = {cost["name"].rsplit("::", 1)[-1]: cost["cpu_s"] for cost in data["costs"]}
    assert cpu["test_detached"] >= 0.9, cpu
    assert cpu["test_light"] < 0.3, cpu
    fixture = next(name for name in cpu if name.startswith("shared ("))
    assert fixture.endswith("test_work.py)") and 0.55 <= cpu[fixture] <= 1.5, cpu  # once a worker that ran it
    assert data["total_cpu_s"] >= cpu["test_detached"] + cpu[fixture], data
    assert "heaviest, in CPU-s" in done.stdout and "test_work.py::test_detached" in done.stdout
