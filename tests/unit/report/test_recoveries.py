"""ddp-bench report shows each run's recoveries (a spare node in a bad node's place, its "recovery"
records in metrics.jsonl) beside the scaling table."""
import json

import pytest
from ddp_bench import cli
from ddp_bench.errors import ReportError
from ddp_bench.recoveries import recovery_table
from test_report import write_run


def add_recovery(run, node="node2", spare="node4", by="roll-call", seconds=61.04, parts=None):
    record = {"type": "recovery", "swaps": [{"node": node, "by": by, "why": "lost mid-run", "spare": spare}],
              "seconds": seconds,
              "parts": {"detection": 15.0, "old step's end": 37.0, "compile": 9.04} if parts is None else parts}
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(record) + "\n")


def test_the_report_has_a_row_per_recovery_with_the_seconds_and_their_parts(tmp_path, capsys):
    crashed = write_run(tmp_path, "crashed", 6, 3, 2000.0)
    add_recovery(crashed)
    add_recovery(crashed, node="node3", spare="node5", by="doctor", seconds=None, parts={})
    calm = write_run(tmp_path, "calm", 6, 3, 2100.0)

    assert cli.main(["report", str(crashed), str(calm), "--out", str(tmp_path / "out")]) == 0

    out = capsys.readouterr().out
    table = out.split("Recoveries (a spare node in a bad node's place, inside the allocation):")[1]
    assert "| Run | Replaced | By spare | Named by | Fault to training (s) | Parts (s) |" in table
    assert "| crashed | node2 | node4 | roll-call | 61.0 | detection 15.0, old step's end 37.0, compile 9.0 |" in table
    assert "| crashed | node3 | node5 | doctor | - | - |" in table
    assert "| calm |" not in table
    assert "Recoveries" in (tmp_path / "out" / "report.md").read_text()


def test_no_recovery_anywhere_means_no_table(tmp_path):
    assert recovery_table([("a", [{"type": "run"}, {"type": "summary"}])]) == ""


def test_a_malformed_recovery_record_is_one_line_naming_the_run():
    with pytest.raises(ReportError, match="run x: a malformed recovery record"):
        recovery_table([("x", [{"type": "recovery", "swaps": [{"node": "node2"}]}])])
