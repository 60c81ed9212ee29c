"""GPU sampler CSVs to mean/min utilisation per GPU and a PNG."""
import pytest

from ddp_bench import cli, gpumon
from ddp_bench.errors import ReportError

HEADER = ("timestamp, index, name, utilization.gpu [%], utilization.memory [%], "
          "memory.total [MiB], memory.used [MiB]\n")


def write_csv(directory, node, rows):
    path = directory / f"gpu-{node}.csv"
    path.write_text(HEADER + "".join(
        f"2026/01/01 00:00:{second:02d}.000, {index}, NVIDIA GH200, {util}, 10, 97871, {mem}\n"
        for second, index, util, mem in rows))
    return path


def test_mean_and_min_utilisation_per_gpu_per_node(tmp_path):
    write_csv(tmp_path, "node1", [(0, 0, 90, 100), (5, 0, 100, 300), (0, 1, 80, 100), (5, 1, 60, 100)])
    write_csv(tmp_path, "node2", [(0, 0, 95, 100)])

    summaries = gpumon.summarise_samples(
        s for path in gpumon.csv_files([tmp_path]) for s in gpumon.read_csv(path))

    assert [(s.node, s.index, s.samples, s.mean_utilisation, s.min_utilisation, s.max_memory_used_mib)
            for s in summaries] == [("node1", 0, 2, 95.0, 90.0, 300.0), ("node1", 1, 2, 70.0, 60.0, 100.0),
                                    ("node2", 0, 1, 95.0, 95.0, 100.0)]


def test_not_available_values_and_a_cut_off_last_line_are_skipped(tmp_path):
    path = write_csv(tmp_path, "node1", [(0, 0, 50, 100)])
    with open(path, "a") as f:
        f.write("2026/01/01 00:00:05.000, 0, NVIDIA GH200, [N/A], 10, 97871, 100\n2026/01/01 00:00:1")

    samples = gpumon.read_csv(path)

    assert [s.utilisation for s in samples] == [50.0]


def test_a_gpu_under_half_the_busiest_is_flagged_as_unbalanced(tmp_path):
    write_csv(tmp_path, "node1", [(0, 0, 100, 1), (0, 1, 30, 1)])

    table = gpumon.summarise([tmp_path])

    assert "| node1 | 1 | NVIDIA GH200 | 1 | 30.0 | 30 | 1 |" in table
    assert "unbalanced GPU use: node1 GPU 1 averages 30%" in table
    assert "node1 GPU 0 averages" not in table


def test_summarise_draws_a_png_beside_the_csvs(tmp_path):
    write_csv(tmp_path, "node1", [(0, 0, 100, 1), (1, 0, 50, 1)])

    gpumon.summarise([tmp_path])

    assert (tmp_path / "gpu-utilisation.png").read_bytes()[:4] == b"\x89PNG"


def test_no_csv_files_is_an_error_pointing_at_the_sampler_logs(tmp_path):
    with pytest.raises(ReportError, match="no gpu-<node>.csv files found.*sampler-<node>.log"):
        gpumon.summarise([tmp_path])


def test_ddp_bench_gpu_prints_the_table(tmp_path, capsys):
    write_csv(tmp_path, "node3", [(0, 0, 42, 1)])

    assert cli.main(["gpu", str(tmp_path)]) == 0

    assert "| node3 | 0 | NVIDIA GH200 | 1 | 42.0 | 42 | 1 |" in capsys.readouterr().out


# rocm-smi --showuse --showmemuse --showmeminfo vram --showpower --csv, as slurm/gpu-sampler.sh
# writes it for an AMD site: its own header once, with the sampler's timestamp column first
# (the ROCm SMI CLI has no repeat flag and prints no time). Memory is in bytes.
ROCM_HEADER = ("timestamp,device,GPU use (%),GPU Memory Allocated (VRAM%),VRAM Total Memory (B),"
               "VRAM Total Used Memory (B),Average Graphics Package Power (W)\n")


def write_rocm_csv(directory, node, rows):
    path = directory / f"gpu-{node}.csv"
    path.write_text(ROCM_HEADER + "".join(
        f"2026/01/01 00:00:{second:02d}.000,card{index},{util},40,68702699520,{mem_mib * 2**20},488.0\n"
        for second, index, util, mem_mib in rows))
    return path


def test_rocm_smi_csvs_give_the_same_summary_with_cards_as_indices_and_bytes_as_mib(tmp_path):
    write_rocm_csv(tmp_path, "nid005000", [(0, 0, 90, 100), (5, 0, 100, 300), (0, 1, 80, 100), (5, 1, 60, 100)])

    summaries = gpumon.summarise_samples(gpumon.read_csv(tmp_path / "gpu-nid005000.csv"))

    assert [(s.node, s.index, s.name, s.samples, s.mean_utilisation, s.min_utilisation, s.max_memory_used_mib)
            for s in summaries] == [("nid005000", 0, "card0", 2, 95.0, 90.0, 300.0),
                                    ("nid005000", 1, "card1", 2, 70.0, 60.0, 100.0)]


def test_rocm_smi_not_available_values_are_skipped(tmp_path):
    path = write_rocm_csv(tmp_path, "nid005000", [(0, 0, 50, 1)])
    with open(path, "a") as f:
        f.write("2026/01/01 00:00:05.000,card0,N/A,40,68702699520,1048576,N/A\n2026/01/01 00:00:1")

    assert [s.utilisation for s in gpumon.read_csv(path)] == [50.0]


def test_nvidia_and_amd_nodes_of_one_report_are_read_each_by_its_own_columns(tmp_path):
    write_csv(tmp_path, "node1", [(0, 0, 100, 1)])
    write_rocm_csv(tmp_path, "nid005000", [(0, 3, 30, 1)])

    table = gpumon.summarise([tmp_path])

    assert "| nid005000 | 3 | card3 | 1 | 30.0 | 30 | 1 |" in table
    assert "unbalanced GPU use: nid005000 GPU 3 averages 30%" in table
