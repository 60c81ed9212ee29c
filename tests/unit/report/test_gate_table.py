"""ddp-bench report shows each run's fabric gate (gate.json) beside the scaling table."""
import json

import pytest
from ddp_bench import cli, report
from ddp_bench.errors import ReportError
from ddp_bench.gate_table import gate_table
from ddp_train.gate import judge
from test_report import write_run

MiB = 2**20


def write_gate(run, ok=True, busbw=1.5, wrong=0, bad=()):
    sizes = (judge.SizeResult(MiB, 900.0, busbw / 2, busbw / 1.5, 0), judge.SizeResult(4 * MiB, 3000.0, busbw / 1.5, busbw, wrong))
    world = judge.GroupResult("world", ("node1", "node2"), 4, sizes)
    faults = tuple(judge.Fault("corrupt", (n,), "x", "0 wrong", "y") for n in bad)
    gate = judge.GateReport(ok, "verdict", world, faults=faults, bad_nodes=tuple(bad), seconds=2.34, backend="gloo on cpu")
    judge.write_report(gate, str(run))


def test_the_report_has_a_gate_row_per_run_with_a_gate_json(tmp_path, capsys):
    fast = write_run(tmp_path, "fast", 4, 2, 2000.0)
    slow = write_run(tmp_path, "slow", 4, 2, 900.0)
    none = write_run(tmp_path, "nogate", 1, 1, 600.0)
    write_gate(fast, busbw=1.5)
    write_gate(slow, ok=False, busbw=0.02, wrong=7, bad=("node2",))

    assert cli.main(["report", str(fast), str(slow), str(none), "--out", str(tmp_path / "out")]) == 0

    out = capsys.readouterr().out
    assert "| Run | Gate | Nodes | Ranks | Size | busbw (GB/s) | algbw (GB/s) | #wrong | Gate time (s) | Named |" in out
    assert "| fast | PASS | 2 | 4 | 4 MiB | 1.500 | 1.000 | 0 | 2.3 | - |" in out
    assert "| slow | FAIL | 2 | 4 | 4 MiB | 0.020 | 0.013 | 7 | 2.3 | node2 |" in out
    assert "| nogate |" not in out.split("Fabric gate")[1]
    assert "Fabric gate" in (tmp_path / "out" / "report.md").read_text()


def test_no_gate_json_anywhere_means_no_gate_table(tmp_path):
    assert gate_table([write_run(tmp_path, "a", 1, 1, 100.0)]) == ""


def test_a_bad_gate_json_is_one_line_naming_it(tmp_path):
    run = write_run(tmp_path, "a", 1, 1, 100.0)
    (run / "gate.json").write_text(json.dumps({"ok": True}))
    with pytest.raises(ReportError, match=r"gate.json is not a fabric gate report .*rerun the gate"):
        report.report([run], tmp_path / "out")
