"""GPU counting: SLURM's variables first, then CUDA_VISIBLE_DEVICES, then /dev/nvidia*."""

import pytest

from ddp_launch.errors import LaunchError
from ddp_launch.gpus import GpuCount, count_device_files, count_gpus, parse_gpus_per_node, visible_devices


@pytest.mark.parametrize("value, expected", [
    ("4", 4), ("gpu:4", 4), ("gpu:a100:4", 4), ("a100:4", 4), ("gpu:a100:2,gpu:v100:2", 4),
    ("gpu:a100:4(S:0-1)", 4),
])
def test_gpus_per_node_forms(value, expected):
    assert parse_gpus_per_node(value) == expected


@pytest.mark.parametrize("value", ["gpu", "gpu:a100", "four", "gpu:-1"])
def test_bad_gpus_per_node_names_the_variable(value):
    with pytest.raises(LaunchError, match=r"SLURM_GPUS_PER_NODE=.*gpu:a100:4"):
        parse_gpus_per_node(value)


@pytest.mark.parametrize("value, expected", [
    ("0,1,2,3", 4), ("2", 1), ("", 0), ("NoDevFiles", 0), ("-1", 0),
    ("GPU-8f0c2f6e-1111-2222-3333-444455556666", 1), ("MIG-a,MIG-b", 2),
])
def test_visible_devices(value, expected):
    assert visible_devices(value) == expected


def test_slurm_gpus_on_node_wins_over_everything():
    env = {"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "gpu:2", "CUDA_VISIBLE_DEVICES": "0"}
    assert count_gpus(env, device_files=8) == GpuCount(4, "SLURM_GPUS_ON_NODE")


def test_gpus_per_node_used_when_gpus_on_node_is_absent():
    assert count_gpus({"SLURM_GPUS_PER_NODE": "gpu:a100:4"}, 0) == GpuCount(4, "SLURM_GPUS_PER_NODE")


def test_cuda_visible_devices_beats_device_files():
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, 8) == GpuCount(2, "CUDA_VISIBLE_DEVICES")


def test_device_files_are_the_last_resort_and_none_means_no_gpu():
    assert count_gpus({}, 4) == GpuCount(4, "/dev/nvidia[0-9]*")
    assert count_gpus({}, 0) is None


def test_non_integer_gpus_on_node_is_an_error():
    with pytest.raises(LaunchError, match="SLURM_GPUS_ON_NODE='4x'"):
        count_gpus({"SLURM_GPUS_ON_NODE": "4x"}, 0)


def test_device_files_count_only_numbered_nodes(fake_dev):
    assert count_device_files(str(fake_dev)) == 4


def test_device_files_under_a_root_without_dev(tmp_path):
    assert count_device_files(str(tmp_path)) == 0
