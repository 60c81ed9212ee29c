"""ddp-bench report: the scaling table from several runs' metrics.jsonl."""
import csv
import io
import json

import pytest

from ddp_bench import cli, report


def write_run(root, name, world_size, nodes, images_per_s, total_time_s=10.0, device="cuda", summary=True,
              data_generated_in=None):
    run = root / name
    run.mkdir()
    records = [{"type": "run", "world_size": world_size, "nodes": nodes, "device": device,
                "data_generated_in": data_generated_in},
               {"type": "epoch", "epoch": 1, "epoch_time_s": 1.0, "images": 100, "images_per_s": images_per_s * 0.9,
                "train_loss": 4.0, "val_loss": 4.0, "val_accuracy": 0.1, "lr": 0.1},
               {"type": "epoch", "epoch": 2, "epoch_time_s": 1.0, "images": 100, "images_per_s": images_per_s,
                "train_loss": 3.0, "val_loss": 3.0, "val_accuracy": 0.2, "lr": 0.1}]
    if summary:
        records.append({"type": "summary", "total_time_s": total_time_s, "images_per_s": images_per_s,
                        "nodes": nodes, "gpus_per_node": world_size // nodes, "world_size": world_size,
                        "final_accuracy": 0.2, "best_accuracy": 0.2, "epochs_run": 2, "early_stopped": False})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.fixture
def seed_runs(tmp_path):
    """The three configurations of the MPCDF Raven tutorial's scaling table
    (github.com/mvigl/MPCDF_tutorial, docs/05_multi_node.md, "Benchmarking All Configurations")."""
    return [write_run(tmp_path, "multinode", 8, 2, 6340.0, 57.14),
            write_run(tmp_path, "single", 1, 1, 1000.0, 362.45),
            write_run(tmp_path, "onenode", 4, 1, 3810.0, 95.23)]


def test_rows_are_ordered_by_world_size_with_speedup_and_efficiency_against_the_smallest(seed_runs):
    rows = report.scaling_rows([report.load_run(p) for p in seed_runs])

    assert [r.run.configuration for r in rows] == [
        "Single GPU", "Multi-GPU (4 GPUs, 1 node)", "Multi-Node (8 GPUs, 2 nodes)"]
    assert [round(r.speedup, 2) for r in rows] == [1.0, 3.81, 6.34]
    assert [round(r.efficiency, 3) for r in rows] == [1.0, 0.953, 0.792]


def test_cpu_runs_are_labelled_as_processes_not_gpus(tmp_path):
    run = report.load_run(write_run(tmp_path, "cpu", 4, 2, 80.0, device="cpu"))

    assert run.configuration == "Multi-Node (4 processes, 2 nodes)"


def test_report_writes_markdown_csv_and_png(seed_runs, tmp_path):
    out = tmp_path / "out"

    done = report.report(seed_runs, out)

    table = done.table
    assert table.splitlines()[0].startswith("| Configuration | Run | Time (s) | Images/s | Speedup | Efficiency")
    assert "| Multi-Node (8 GPUs, 2 nodes) | multinode | 57.14 | 6340.0 | 6.34x | 79% | 0.2000 |" in table
    assert (out / "report.md").read_text() == table
    rows = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    assert [r["world_size"] for r in rows] == ["1", "4", "8"]
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert done.written == (out / "report.md", out / "report.csv", out / "report.png")
    assert done.notes == ()


def test_a_run_on_generated_data_is_noted_in_the_report_and_last_on_the_console(tmp_path, capsys):
    # make demo's last lines are these: a demo without CIFAR-100 trains on --demo's generated set.
    demo = write_run(tmp_path, "demo", 2, 1, 200.0, device="cpu", data_generated_in="runs/demo/synthetic-data")
    real = write_run(tmp_path, "real", 2, 1, 200.0, device="cpu")
    out = tmp_path / "out"

    code = cli.main(["report", str(demo), str(real), "--out", str(out)])

    assert code == 0
    captured = capsys.readouterr()
    note = ("demo trained on generated data in CIFAR-100's format (runs/demo/synthetic-data), not on CIFAR-100: "
            "its accuracy says how well the model learns that set; `make data` fetches CIFAR-100")
    assert f"Note: {note}" in captured.out and "real trained" not in captured.out
    assert (out / "report.md").read_text() == captured.out
    assert captured.err.splitlines() == [
        f"note: {note}",
        f"written: {out}/report.md, report.csv, report.png (the plots: report.png)"]


def test_ddp_bench_alone_lists_its_commands(capsys):
    assert cli.main([]) == 0

    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert listed == list(cli.build_parser()._subparsers._group_actions[0].choices)
    assert listed == ["report", "gpu"]


def test_a_run_without_a_summary_is_an_error_naming_it(tmp_path, capsys):
    run = write_run(tmp_path, "unfinished", 2, 1, 10.0, summary=False)

    code = cli.main(["report", str(run), "--out", str(tmp_path / "out")])

    assert code == 2
    err = capsys.readouterr().err
    assert err == f"ddp-bench: error: {run}/metrics.jsonl has no summary record: the run did not finish; " \
                  "resume it or leave it out\n"


def test_a_directory_without_metrics_is_an_error(tmp_path, capsys):
    code = cli.main(["report", str(tmp_path), "--out", str(tmp_path / "out")])

    assert code == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


def test_a_corrupt_metrics_line_is_an_error_with_its_line_number(tmp_path, capsys):
    run = write_run(tmp_path, "bad", 1, 1, 10.0)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("{not json\n")

    code = cli.main(["report", str(run), "--out", str(tmp_path / "out")])

    assert code == 2
    assert "line 5: not JSON" in capsys.readouterr().err
