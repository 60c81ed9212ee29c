"""`ddp-bench report|gpu` on malformed metrics or CSV files, odd output paths and bad flags: one line
`ddp-bench: error: ...` naming the file and the fix, exit 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_bench import cli

RUN = {"type": "run", "world_size": 2, "nodes": 1, "device": "cpu"}
EPOCH = {"type": "epoch", "epoch": 1, "images_per_s": 100.0, "val_accuracy": 0.5}
SUMMARY = {"type": "summary", "total_time_s": 10.0, "images_per_s": 100.0, "nodes": 1, "world_size": 2,
           "final_accuracy": 0.5}
CSV_HEADER = ("timestamp, index, name, utilization.gpu [%], utilization.memory [%], memory.total [MiB], "
              "memory.used [MiB]\n")
CSV_ROW = "2026/01/01 00:00:00.000, 0, NVIDIA GH200, 90, 10, 97871, 100\n"


def lines(*records: object) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def run_dir_with(tmp_path: Path, metrics: str | bytes) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    path.write_bytes(metrics if isinstance(metrics, bytes) else metrics.encode())
    return run


BAD_METRICS = {
    "not JSON in the middle": lines(RUN) + "{oops\n" + lines(SUMMARY),
    "a cut-off summary (the last line)": lines(RUN, EPOCH) + json.dumps(SUMMARY)[:30],
    "a record that is not an object": lines(RUN, [1, 2], SUMMARY),
    "a number for a line": "3\n",
    "no summary": lines(RUN, EPOCH),
    "empty file": "",
    "summary without nodes": lines(RUN, {k: v for k, v in SUMMARY.items() if k != "nodes"}),
    "summary world_size not a number": lines(RUN, {**SUMMARY, "world_size": "four"}),
    "summary world_size 0": lines(RUN, {**SUMMARY, "world_size": 0}),
    "summary nodes null": lines(RUN, {**SUMMARY, "nodes": None}),
    "summary nodes infinite": lines(RUN) + json.dumps(SUMMARY).replace('"nodes": 1', '"nodes": 1e400') + "\n",
    "epoch without images_per_s": lines(RUN, {"type": "epoch", "epoch": 1, "val_accuracy": 0.5}, SUMMARY),
    "not UTF-8": b"\xff\xfe" + lines(RUN, SUMMARY).encode(),
}


def assert_one_line_error(code: int, capsys) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "Traceback" not in captured.err
    err_lines = captured.err.splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("ddp-bench: error: "), captured.err
    return err_lines[0]


@pytest.mark.parametrize("metrics", BAD_METRICS.values(), ids=BAD_METRICS.keys())
def test_malformed_metrics_are_one_line_naming_the_file(metrics, tmp_path, capsys):
    run = run_dir_with(tmp_path, metrics)
    code = cli.main(["report", str(run), "--out", str(tmp_path / "out")])
    line = assert_one_line_error(code, capsys)
    assert str(run / "metrics.jsonl") in line


def test_a_cut_off_last_line_after_the_summary_is_left_out(tmp_path, capsys):
    # A run killed while appending a record after its summary: the summary stands.
    run = run_dir_with(tmp_path, lines(RUN, EPOCH, SUMMARY) + '{"type": "epo')
    assert cli.main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    assert "| 100.0 |" in capsys.readouterr().out


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


BAD_REPORT_CALLS = {
    "--out is a file": lambda t, run: ["report", str(run), "--out", str(_file(t))],
    "--out below a file": lambda t, run: ["report", str(run), "--out", str(_file(t) / "out")],
    "a run dir that does not exist": lambda t, run: ["report", str(t / "nowhere")],
    "a run dir without metrics": lambda t, run: ["report", str(t)],
    "no run dir": lambda t, run: ["report"],
    "abbreviated --ou": lambda t, run: ["report", str(run), "--ou", str(t / "out")],
    "unknown flag": lambda t, run: ["report", str(run), "--colour"],
    "unknown command": lambda t, run: ["plot", str(run)],
}


@pytest.mark.parametrize("make_argv", BAD_REPORT_CALLS.values(), ids=BAD_REPORT_CALLS.keys())
def test_bad_report_calls_are_one_line(make_argv, tmp_path, capsys):
    run = run_dir_with(tmp_path, lines(RUN, EPOCH, SUMMARY))
    assert_one_line_error(cli.main(make_argv(tmp_path, run)), capsys)


def gpu_dir_with(tmp_path: Path, content: str | bytes) -> Path:
    directory = tmp_path / "gpu"
    directory.mkdir()
    path = directory / "gpu-node1.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return directory


BAD_CSVS = {
    "missing columns": "timestamp, index, name\n2026/01/01 00:00:00.000, 0, GH200\n",
    "only a header": CSV_HEADER,
    "empty file": "",
    "not UTF-8": CSV_HEADER.encode() + b"\xff\xfe\xfd, 0, x, 90, 10, 1, 1\n",
    "a garbled index on every line": CSV_HEADER + CSV_ROW.replace(", 0,", ", zero,") * 3,
}


@pytest.mark.parametrize("content", BAD_CSVS.values(), ids=BAD_CSVS.keys())
def test_malformed_gpu_csvs_are_one_line(content, tmp_path, capsys):
    directory = gpu_dir_with(tmp_path, content)
    code = cli.main(["gpu", str(directory), "--png", str(tmp_path / "gpu.png")])
    line = assert_one_line_error(code, capsys)
    assert "gpu-node1.csv" in line


BAD_GPU_CALLS = {
    "--png is a directory": lambda t, d: ["gpu", str(d), "--png", str(t)],
    "--png in a missing directory": lambda t, d: ["gpu", str(d), "--png", str(t / "no" / "gpu.png")],
    "--png below a file": lambda t, d: ["gpu", str(d), "--png", str(_file(t) / "gpu.png")],
    "--png with an unknown image type": lambda t, d: ["gpu", str(d), "--png", str(t / "gpu.xyz")],
    "--out, which gpu does not have": lambda t, d: ["gpu", str(d), "--out", str(t / "o")],
    "a path that does not exist": lambda t, d: ["gpu", str(t / "nowhere")],
    "a directory without CSVs": lambda t, d: ["gpu", str(_empty_dir(t))],
}


def _empty_dir(tmp_path: Path) -> Path:
    path = tmp_path / "empty"
    path.mkdir()
    return path


@pytest.mark.parametrize("make_argv", BAD_GPU_CALLS.values(), ids=BAD_GPU_CALLS.keys())
def test_bad_gpu_calls_are_one_line(make_argv, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the PNG cases need matplotlib, a test dependency")
    directory = gpu_dir_with(tmp_path, CSV_HEADER + CSV_ROW)
    assert_one_line_error(cli.main(make_argv(tmp_path, directory)), capsys)
