"""GPU counting: SLURM's variables first, then the vendor's visible-device variables
(CUDA_VISIBLE_DEVICES; ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES), then its device files."""

import pytest

from ddp_launch.accelerators import load_accelerator
from ddp_launch.errors import LaunchError
from ddp_launch.facts import probe
from ddp_launch.gpus import GpuCount, count_gpus, parse_gpus_per_node, visible_devices
from ddp_launch.schedulers import gpu_grants

NVIDIA = load_accelerator("nvidia", {})
AMD = load_accelerator("amd", {})
# Every scheduler's GPU variables (each module's GPU_GRANT), as the doctor reads them.
EVERY = gpu_grants()


@pytest.mark.parametrize("value, expected", [
    ("4", 4), ("gpu:4", 4), ("gpu:a100:4", 4), ("a100:4", 4), ("gpu:a100:2,gpu:v100:2", 4),
    ("gpu:a100:4(S:0-1)", 4),
])
def test_gpus_per_node_forms(value, expected):
    assert parse_gpus_per_node(value, "SLURM_GPUS_PER_NODE") == expected


@pytest.mark.parametrize("value", ["gpu", "gpu:a100", "four", "gpu:-1"])
def test_bad_gpus_per_node_names_the_variable(value):
    with pytest.raises(LaunchError, match=r"SLURM_GPUS_PER_NODE=.*gpu:a100:4"):
        parse_gpus_per_node(value, "SLURM_GPUS_PER_NODE")


@pytest.mark.parametrize("value, expected", [
    ("0,1,2,3", 4), ("2", 1), ("", 0), ("NoDevFiles", 0), ("-1", 0),
    ("GPU-8f0c2f6e-1111-2222-3333-444455556666", 1), ("MIG-a,MIG-b", 2),
])
def test_visible_devices(value, expected):
    assert visible_devices(value) == expected


def test_slurm_gpus_on_node_wins_over_everything():
    env = {"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "gpu:2", "CUDA_VISIBLE_DEVICES": "0"}
    assert count_gpus(env, 8, NVIDIA, EVERY) == GpuCount(4, "SLURM_GPUS_ON_NODE")


def test_gpus_per_node_used_when_gpus_on_node_is_absent():
    assert count_gpus({"SLURM_GPUS_PER_NODE": "gpu:a100:4"}, 0, NVIDIA, EVERY) == GpuCount(4, "SLURM_GPUS_PER_NODE")


def test_cuda_visible_devices_beats_device_files():
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, 8, NVIDIA, EVERY) == GpuCount(2, "CUDA_VISIBLE_DEVICES")


def test_device_files_are_the_last_resort_and_none_means_no_gpu():
    assert count_gpus({}, 4, NVIDIA, EVERY) == GpuCount(4, "/dev/nvidia[0-9]*")
    assert count_gpus({}, 0, NVIDIA, EVERY) is None
    assert count_gpus({}, 8, AMD, EVERY) == GpuCount(8, "/dev/dri/renderD*")


def test_amd_counts_rocr_visible_devices_first_and_ignores_cuda_visible_devices():
    # ROCm docs, GPU isolation techniques: ROCR_VISIBLE_DEVICES (ROCr), then HIP_VISIBLE_DEVICES.
    env = {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert count_gpus(env, 8, AMD, EVERY) == GpuCount(2, "ROCR_VISIBLE_DEVICES")
    assert count_gpus({"HIP_VISIBLE_DEVICES": "0,1,2"}, 8, AMD, EVERY) == GpuCount(3, "HIP_VISIBLE_DEVICES")
    assert count_gpus({"ROCR_VISIBLE_DEVICES": "0"}, 8, NVIDIA, EVERY) == GpuCount(8, "/dev/nvidia[0-9]*")


def test_non_integer_gpus_on_node_is_an_error():
    with pytest.raises(LaunchError, match="SLURM_GPUS_ON_NODE='4x'"):
        count_gpus({"SLURM_GPUS_ON_NODE": "4x"}, 0, NVIDIA, EVERY)


def test_device_files_count_only_numbered_nodes(fake_dev):
    assert probe(str(fake_dev), accelerator=NVIDIA).gpu_device_files == 4


def test_amd_device_files_are_the_render_nodes_not_kfd_or_cards(tmp_path):
    # One /dev/dri/renderD<N> per GPU (MI250X: per GCD) beside /dev/kfd and /dev/dri/card<N>.
    dri = tmp_path / "dev" / "dri"
    dri.mkdir(parents=True)
    (tmp_path / "dev" / "kfd").touch()
    for index in range(8):
        (dri / f"renderD{128 + index}").touch()
        (dri / f"card{index}").touch()
    assert probe(str(tmp_path), accelerator=AMD).gpu_device_files == 8
    assert probe(str(tmp_path), accelerator=NVIDIA).gpu_device_files == 0


def test_device_files_under_a_root_without_dev(tmp_path):
    assert probe(str(tmp_path), accelerator=NVIDIA).gpu_device_files == 0
    assert probe(str(tmp_path), accelerator=AMD).gpu_device_files == 0


# -- granted GPUs that CUDA cannot reach (apptainer run without --nv) ------------------------

from ddp_launch import cli, gpus  # noqa: E402
from ddp_launch.gpus import (GpuGrant, GrantedDevices, granted_devices, granted_gpus, probe_driver,  # noqa: E402
                             require_usable_gpus)

REAL_PROBE = probe_driver  # imported before the autouse fixture replaces it
NO_DRIVER = "libcuda.so.1 not found: the NVIDIA driver libraries are not in this container"


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_GPUS_ON_NODE": "4"}, GpuGrant(4, "SLURM_GPUS_ON_NODE=4", NVIDIA)),
    ({"SLURM_JOB_GPUS": "0,1"}, GpuGrant(2, "SLURM_JOB_GPUS=0,1", NVIDIA)),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, GpuGrant(4, "CUDA_VISIBLE_DEVICES=0,1,2,3", NVIDIA)),
    ({"RUNAI_NUM_OF_GPUS": "8"}, GpuGrant(8, "RUNAI_NUM_OF_GPUS=8", NVIDIA)),
    ({"SLURM_GPUS_ON_NODE": "0", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
    ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ({}, None),
])
def test_granted_gpus_reads_each_schedulers_words(env, expected):
    assert granted_gpus(env, NVIDIA, EVERY) == expected


def test_amd_grants_come_from_rocr_visible_devices_not_cuda_visible_devices():
    assert granted_gpus({"ROCR_VISIBLE_DEVICES": "0,1"}, AMD, EVERY) == GpuGrant(2, "ROCR_VISIBLE_DEVICES=0,1", AMD)
    assert granted_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, AMD, EVERY) is None
    assert granted_gpus({"ROCR_VISIBLE_DEVICES": "0,1"}, NVIDIA, EVERY) is None


@pytest.mark.parametrize("env, accelerator, expected", [
    # srun(1): SLURM_STEP_GPUS and SLURM_JOB_GPUS are the node's GPU IDs, "not relative to any device
    # cgroup"; the step's come first, then the job's, then the runtime's visible devices.
    ({"SLURM_STEP_GPUS": "2", "SLURM_JOB_GPUS": "0,1,2", "CUDA_VISIBLE_DEVICES": "0"}, NVIDIA,
     GrantedDevices("SLURM_STEP_GPUS", ("2",))),
    ({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}, NVIDIA, GrantedDevices("SLURM_JOB_GPUS", ("1", "3"))),
    # CUDA C Programming Guide: indices or UUIDs (MIG ids too).
    ({"CUDA_VISIBLE_DEVICES": "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6, MIG-GPU-8932f937/1/0"}, NVIDIA,
     GrantedDevices("CUDA_VISIBLE_DEVICES", ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "MIG-GPU-8932f937/1/0"))),
    ({"ROCR_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "0"}, AMD, GrantedDevices("ROCR_VISIBLE_DEVICES", ("4", "5"))),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, NVIDIA, None),
    ({"SLURM_GPUS_ON_NODE": "4"}, NVIDIA, None),
])
def test_granted_devices_are_named_by_slurms_ids_first_then_the_runtimes_visible_devices(env, accelerator, expected):
    assert granted_devices(env, accelerator, EVERY) == expected


def test_granted_but_unusable_gpus_on_a_gpu_node_name_apptainer_nv_and_the_cpu_way():
    # /dev/nvidia0..3 are there (Apptainer binds the host's /dev), the driver libraries are not.
    with pytest.raises(LaunchError) as raised:
        require_usable_gpus(GpuGrant(4, "SLURM_GPUS_ON_NODE=4", NVIDIA), NO_DRIVER, on_kubernetes=False, gpu_device_files=4)
    message = str(raised.value)
    assert "SLURM_GPUS_ON_NODE=4 granted 4 GPU(s)" in message
    assert "apptainer run --nv" in message and "--cpu-workers N" in message


def test_granted_gpus_on_a_node_without_nvidia_devices_say_it_is_not_a_gpu_node():
    # `apptainer run --nv` there binds nothing (no driver on the host): "add --nv" would be
    # advice to a user who already did.
    with pytest.raises(LaunchError) as raised:
        require_usable_gpus(GpuGrant(4, "SLURM_GPUS_ON_NODE=4", NVIDIA), NO_DRIVER, on_kubernetes=False, gpu_device_files=0)
    message = str(raised.value)
    assert "no NVIDIA devices (/dev/nvidia[0-9]*)" in message and "no driver libraries for Apptainer's --nv" in message
    assert "not a GPU node?" in message and "apptainer run --nv`" not in message


def test_on_kubernetes_the_fix_is_the_device_plugin():
    with pytest.raises(LaunchError, match="NVIDIA device plugin"):
        require_usable_gpus(GpuGrant(4, "RUNAI_NUM_OF_GPUS=4", NVIDIA), NO_DRIVER, on_kubernetes=True)


def test_usable_or_ungranted_gpus_pass():
    require_usable_gpus(GpuGrant(4, "SLURM_GPUS_ON_NODE=4", NVIDIA), None, on_kubernetes=False)
    require_usable_gpus(None, NO_DRIVER, on_kubernetes=False)


def test_amd_grants_without_rocm_name_apptainer_rocm_hip_and_the_render_nodes():
    no_hip = "libamdhip64.so not found: the AMD driver libraries are not in this container"
    grant = GpuGrant(8, "ROCR_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", AMD)
    with pytest.raises(LaunchError) as raised:
        require_usable_gpus(grant, no_hip, on_kubernetes=False, gpu_device_files=8)
    message = str(raised.value)
    assert "HIP cannot use any here" in message and "apptainer run --rocm" in message and "--nv" not in message
    with pytest.raises(LaunchError) as raised:
        require_usable_gpus(grant, no_hip, on_kubernetes=False, gpu_device_files=0)
    assert "no AMD devices (/dev/dri/renderD*)" in str(raised.value) and "Apptainer's --rocm" in str(raised.value)
    with pytest.raises(LaunchError, match="amd.com/gpu and the AMD GPU device plugin"):
        require_usable_gpus(grant, no_hip, on_kubernetes=True)


def test_the_real_probe_names_a_missing_driver_library():
    missing = NVIDIA._replace(driver_library="libcuda-missing.so.9")
    assert "libcuda-missing.so.9 not found" in REAL_PROBE(missing)
    assert "libamdhip64.so not found: the AMD driver" in REAL_PROBE(AMD)  # no ROCm on this test machine


def test_the_real_probe_refuses_a_library_that_is_not_the_driver():
    assert "has no cuInit" in REAL_PROBE(NVIDIA._replace(driver_library="libc.so.6"))
    assert "has no hipInit" in REAL_PROBE(AMD._replace(driver_library="libc.so.6"))


SLURM_NODE = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n1",
              "SLURM_STEP_NODELIST": "n1", "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1",
              "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_GPUS_ON_NODE": "4"}


def _only(env, monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith(("SLURM", "PET_", "RUNAI", "DDP_", "TORCHELASTIC", "CUDA_VISIBLE")):
            monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_a_slurm_launch_without_nv_stops_in_one_line_with_exit_2(monkeypatch, capsys):
    _only(SLURM_NODE, monkeypatch)
    monkeypatch.setattr(gpus, "probe_driver", lambda accelerator: NO_DRIVER)

    code = cli.main(["--dry-run"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ddp-launch: error: SLURM_GPUS_ON_NODE=4 granted 4 GPU(s)")


def test_cpu_workers_skip_the_driver_check(monkeypatch, capsys):
    _only({**SLURM_NODE, "DDP_LAUNCH_CPU_WORKERS": "2"}, monkeypatch)
    monkeypatch.setattr(gpus, "probe_driver", lambda accelerator: pytest.fail("probed a CPU launch"))

    assert cli.main(["--dry-run"]) == 0
    assert "--nproc-per-node=2" in capsys.readouterr().out


# -- an AMD site end to end: the plan counts and checks the GPUs with the vendor's words -----

def _lumi_node(tmp_path, gcds: int = 8):
    """A LUMI-G node's /dev: /dev/kfd and one render node per MI250X GCD, four CXI NICs."""
    from fakes.node import FakeNode

    node = FakeNode(tmp_path / "node")
    node.cxi(4)
    node.file("/dev/kfd")
    for index in range(gcds):
        node.file(f"/dev/dri/renderD{128 + index}")
    node.file("/usr/lib64/librccl-net.so")
    return node.root


def _without(env, *names):
    return {k: v for k, v in env.items() if k not in names}


def test_an_amd_site_counts_workers_from_rocr_visible_devices_then_the_render_nodes(tmp_path):
    from launch_envs import lumi, plan_on_tree

    root = _lumi_node(tmp_path)
    rocr = _without(lumi(0), "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")
    assert "8 worker(s) per node from ROCR_VISIBLE_DEVICES" in plan_on_tree(rocr, root, "--site", "lumi").notes
    bare = _without(rocr, "ROCR_VISIBLE_DEVICES")
    assert "8 worker(s) per node from /dev/dri/renderD*" in plan_on_tree(bare, root, "--site", "lumi").notes


def test_an_amd_site_asks_the_hip_driver_and_names_apptainer_rocm(tmp_path, monkeypatch):
    from launch_envs import lumi, plan_on_tree

    asked = []
    monkeypatch.setattr(gpus, "probe_driver", lambda vendor: asked.append(vendor.name) or
                        f"{vendor.driver_library} not found: the AMD driver libraries are not in this container")
    with pytest.raises(LaunchError) as raised:
        plan_on_tree(lumi(0), _lumi_node(tmp_path), "--site", "lumi")
    message = str(raised.value)
    assert asked == ["amd"]
    assert message.startswith("SLURM_GPUS_ON_NODE=8 granted 8 GPU(s) but HIP cannot use any here (libamdhip64.so")
    assert "apptainer run --rocm" in message and "--nv" not in message
