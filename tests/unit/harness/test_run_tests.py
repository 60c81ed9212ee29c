"""`make test`'s runner (tools/run_tests.py): every suite runs, the failures are named at the end, and
each phase says its minutes and CPU-seconds, in seconds and in units of one `import torch` here."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import run_tests  # tools/run_tests.py, on pyproject's pythonpath

REPO = Path(__file__).resolve().parents[3]

# proc(5), /proc/stat: "cpu  user nice system idle iowait irq softirq steal guest guest_nice", in USER_HZ.
STAT = ("cpu  10132153 290696 3084719 46828483 16683 0 25195 0 175628 0\n"
        "cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0\n")


def test_the_machines_cpu_time_is_every_busy_state_but_the_guests_counted_twice():
    # user + nice + system + irq + softirq + steal; guest is inside user already (proc(5)).
    assert run_tests.machine_cpu_s(STAT, 100) == pytest.approx((10132153 + 290696 + 3084719 + 25195) / 100)


def test_this_machines_proc_stat_reads_and_grows_with_work():
    before = run_tests.read_clock()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    after = run_tests.read_clock()
    spent = after.own_cpu_s - before.own_cpu_s
    assert spent > 0.05
    assert after.machine_cpu_s - before.machine_cpu_s >= spent * 0.8  # the machine saw it too (tick rounding)


def test_the_start_mark_round_trips_and_a_damaged_one_is_ignored():
    reading = run_tests.Reading(1796000000.5, 1234.5, 0.0)
    assert run_tests.parse_clock_line(run_tests.clock_line(reading)) == reading
    assert run_tests.parse_clock_line("") is None and run_tests.parse_clock_line("x y") is None


def test_the_summary_counts_phases_in_cpu_seconds_and_torch_imports():
    phases = [run_tests.Phase("tests/unit with tests/bats beside it", 300.0, 540.0, 500.0),
              run_tests.Phase("tests/e2e", 1200.0, 2160.0, 900.0)]
    whole = run_tests.Phase("make test", 1800.0, 3150.0, 0.0)
    assert run_tests.summary_lines(phases, 1.8, whole, "cgroup v2") == [
        "time: one `import torch` here: 1.80 CPU-s (the unit of the budget, docs/testing.md)",
        "time: a phase's processes counted by cgroup v2; the machine's: /proc/stat, every user's",
        "time: tests/unit with tests/bats beside it: 5.0 min, its processes 500 CPU-s = 278 torch imports "
        "(the machine's 540 CPU-s)",
        "time: tests/e2e: 20.0 min, its processes 900 CPU-s = 500 torch imports (the machine's 2,160 CPU-s)",
        "time: make test, from its start (venv, lint, images included): 30.0 min, the machine's 3,150 CPU-s = "
        "1,750 torch imports"]


@pytest.mark.skipif(shutil.which("bats") is None, reason="bats not installed (make sysdeps installs it)")
def test_a_run_names_each_suites_failures_at_the_end_with_its_times(tmp_path):
    # A tree of three tiny suites, one failing test in each of unit and bats, run by the runner itself.
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "bats").mkdir()
    (tmp_path / "tests" / "e2e").mkdir()
    (tmp_path / "tests" / "unit" / "test_u.py").write_text("def test_ok():\n    pass\n\ndef test_broken():\n"
                                                          "    assert False\n")
    (tmp_path / "tests" / "bats" / "b.bats").write_text("@test 'fine' { true; }\n@test 'bad' { false; }\n")
    (tmp_path / "tests" / "e2e" / "test_e.py").write_text(
        "import subprocess, sys\ndef test_e():\n    subprocess.run([sys.executable, '-c', 'sum(range(10**7))'])\n")
    # The e2e world's builder, run beside the unit suite: its verdict lines are shown, its chatter is not.
    (tmp_path / "tests" / "e2e" / "world.py").write_text(
        "import sys, time\nprint('apptainer-root: building', file=sys.stderr)\ntime.sleep(0.5)\n"
        "print('e2e world: cluster root: /var/tmp/root-1 (41 s)')\n")
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests")  # each test's CPU-seconds

    done = subprocess.run([sys.executable, str(REPO / "tools" / "run_tests.py"), "--e2e-workers", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DDP_TEST_CPU_REPORTS": str(tmp_path / "cpu"),
                               "PYTHONPATH": f"{REPO / 'tests'}:{REPO / 'tools'}"})

    assert done.returncode == 1, done.stdout + done.stderr
    world = done.stdout.split("--- the e2e world, built beside tests/unit (tests/e2e/world.py) ---\n", 1)[1]
    assert world.splitlines()[0] == "e2e world: cluster root: /var/tmp/root-1 (41 s)"
    tail = done.stdout.split("--- what failed (the whole reports are above) ---\n", 1)[1].splitlines()
    assert tail[0] == "FAILED tests/unit/test_u.py::test_broken - assert False"
    assert tail[1] == "not ok 2 bad"
    assert [line.split(":")[1].strip() for line in tail if line.startswith("time: ") and "min," in line] == [
        "tests/unit with tests/bats and the e2e world beside it", "tests/e2e"]
    # Each pytest suite's heaviest tests, in CPU-seconds, at the end: the e2e test's child process first.
    heaviest = [line for line in tail if line.startswith("cpu: ")]
    assert heaviest[0].startswith("cpu: tests/unit: ") and "CPU-s" in heaviest[0]
    e2e = heaviest[heaviest.index(next(line for line in heaviest if line.startswith("cpu: tests/e2e: "))):]
    assert e2e[1].startswith("cpu: tests/e2e: the ") and e2e[2].endswith("tests/e2e/test_e.py::test_e"), heaviest
    assert tail[-1] == "make test: tests/unit FAILED, tests/bats FAILED, tests/e2e passed"
    # The unit of the budget is read at the start and again at the end, when the run has the machine to itself.
    unit_line = next(line for line in tail if line.startswith("time: one `import torch` here: "))
    assert "CPU-s (the least of its readings at the run's start and end, " in unit_line, unit_line
    # Every test's CPU-seconds, kept where DDP_TEST_CPU_REPORTS says.
    kept = json.loads((tmp_path / "cpu" / "e2e.json").read_text())
    assert "tests/e2e/test_e.py::test_e" in [cost["name"] for cost in kept["costs"]], kept
    assert (tmp_path / "cpu" / "unit.json").is_file()
    assert tail[-2] == f"cpu: every test's CPU-seconds (DDP_TEST_CPU_REPORTS): {tmp_path / 'cpu' / 'unit.json'}, " \
                      f"{tmp_path / 'cpu' / 'e2e.json'}"


def test_the_unit_is_the_least_import_reading_and_the_line_shows_both():
    # The run's start shares the cores with the e2e world's build (world-ahead): a reading there is high.
    readings = (2.82, 2.31)
    unit = run_tests.budget_unit(readings)
    whole = run_tests.Phase("make test", 1800.0, 3750.0, 0.0)
    lines = run_tests.summary_lines([], unit, whole, "", readings)
    assert lines[0] == ("time: one `import torch` here: 2.31 CPU-s (the least of its readings at the run's start and "
                        "end, 2.82 and 2.31: the unit of the budget, docs/testing.md)")
    assert lines[-1].endswith("the machine's 3,750 CPU-s = 1,623 torch imports")


def test_an_e2e_setup_failure_is_named_first_among_the_failures():
    # Under pytest-xdist the worker that stops on a setup failure (tests/e2e/conftest.py, setup_failed)
    # leaves the controller an INTERNALERROR only; its line comes from the file the runner names.
    setup = "e2e setup failed: the cluster's root: debootstrap failed: E: Couldn't download packages (log: x)\n"
    unit = "..F\nFAILED tests/unit/test_u.py::test_broken - assert False\n1 failed, 2 passed\n"
    assert run_tests.failures(unit, "ok 1 fine\nnot ok 2 bad\n", "INTERNALERROR> assert not crashitem\n", setup) == [
        setup.strip(), "FAILED tests/unit/test_u.py::test_broken - assert False", "not ok 2 bad"]
    assert run_tests.failures(unit, "", "", "") == ["FAILED tests/unit/test_u.py::test_broken - assert False"]


def test_the_worlds_verdicts_are_shown_or_the_end_of_its_log_where_it_gave_none():
    log = "apptainer-root: building x\ne2e world: cluster root: /r (40 s)\ne2e world: test base: b (90 s)\n"
    assert run_tests.world_lines(log) == "e2e world: cluster root: /r (40 s)\ne2e world: test base: b (90 s)"
    crashed = "".join(f"step {n}\n" for n in range(30)) + "Traceback (most recent call last):\nKeyError: 'x'\n"
    assert run_tests.world_lines(crashed).splitlines() == crashed.splitlines()[-run_tests.WORLD_TAIL:]
    assert run_tests.world_lines("") == "(it printed nothing)"


def test_the_world_started_ahead_runs_on_after_the_runner_returns_and_logs_in_the_checkout(tmp_path):
    # `make test`'s world-ahead target: the world builds beside the venv's pip, not waited for; the
    # runner's own start of it, later, waits on its locks (tests/e2e/world.py).
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "world.py").write_text(
        "import os, pathlib, time\ntime.sleep(5)\nprint('e2e world: cluster root: /r (5 s)', flush=True)\n"
        "pathlib.Path('built').write_text(str(os.getsid(0)))\n")

    done = subprocess.run([sys.executable, str(REPO / "tools" / "run_tests.py"), "--start-world"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{REPO / 'tools'}"})

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"e2e world: started ahead, beside the venv's pip (log: {run_tests.WORLD_AHEAD_LOG})\n"
    assert not (tmp_path / "built").exists()  # the runner did not wait for it
    deadline = time.monotonic() + 60
    while not (tmp_path / "built").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert int((tmp_path / "built").read_text()) != os.getsid(0)  # a session of its own: make's end leaves it be
    assert (tmp_path / run_tests.WORLD_AHEAD_LOG).read_text() == "e2e world: cluster root: /r (5 s)\n"
