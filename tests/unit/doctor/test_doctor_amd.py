"""`ddp-launch doctor` on an AMD site (LUMI-G: MI250X on Slingshot): the vendor's device files,
Apptainer flag, driver, collective (RCCL) and net plugin (aws-ofi-rccl's librccl-net.so)."""

from __future__ import annotations

from fakes.elf_tree import build_library
from test_doctor import FakeProbes, doctor

# torch's ROCm build answers through torch.cuda (HIP is exposed as the CUDA device type); its
# torch.version.cuda is None and torch.version.hip is set (PyTorch HIP semantics notes).
ROCM_TORCH = {"version": "2.5.1+rocm6.2", "cuda": None, "hip": "6.2.41133", "nccl": "2.20.5", "cuda_device_count": 8}
LIBRARY_PATH = "/opt/cray/libfabric/1.15.2.0/lib64:/usr/lib64:/opt/rocm/lib"
# Node 0 of a 2-node LUMI-G step (srun --ntasks-per-node=1 --gpus-per-node=8).
LUMI_JOB = {
    "SLURM_JOB_ID": "8123456", "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "nid[005000-005001]", "SLURM_STEP_NODELIST": "nid[005000-005001]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    "SLURMD_NODENAME": "nid005000", "SLURM_GPUS_ON_NODE": "8", "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    "LD_LIBRARY_PATH": LIBRARY_PATH, "SINGULARITY_BIND": "/opt/cray,/usr/lib64/libcxi.so.1",
}


def lumi_devices(node, gcds=8):
    """/dev/kfd and a render node per GCD (ROCm docs, Docker and ROCm), the amdgpu module's
    version in sysfs, the CXI NICs."""
    node.cxi(4)
    node.file("/dev/kfd")
    for index in range(gcds):
        node.file(f"/dev/dri/renderD{128 + index}")
        node.file(f"/dev/dri/card{index}")
    node.file("/sys/module/amdgpu/version", "6.8.5\n")


def lumi_node(node, plugin=True, gcds=8):
    """LUMI-G's devices, the host files LUMI's bindings module binds, RCCL in the image."""
    lumi_devices(node, gcds)
    node.file("/usr/lib64/libcxi.so.1")
    node.file("/opt/cray/libfabric/1.15.2.0/lib64/libfabric.so.1")
    node.file("/opt/rocm/lib/librccl.so.1")
    if plugin:
        node.file("/usr/lib64/librccl-net.so")


def test_a_healthy_lumi_node_passes_with_rccl_its_plugin_and_the_hip_driver(node):
    lumi_node(node)
    fake = FakeProbes(torch=ROCM_TORCH)
    code, checks, report = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB, fake)
    assert code == 0 and report["ok"], [c for c in checks.values() if c["status"] == "FAIL"]
    assert checks["gpus"]["detail"] == "8 GPUs visible (torch.cuda.device_count()), 8 granted"
    assert checks["torch"]["detail"] == "torch 2.5.1+rocm6.2, HIP 6.2.41133, RCCL 2.20.5"
    assert checks["RCCL"]["status"] == "OK" and "/opt/rocm/lib/librccl.so.1 loads" in checks["RCCL"]["detail"]
    assert "/usr/lib64/librccl-net.so loads" in checks["OFI plugin"]["detail"]
    assert checks["HIP driver"] == {"name": "HIP driver", "status": "OK",
                                    "detail": "driver 6.8 runs the image's HIP 6.2.41133", "fix": ""}
    assert "libcudart.so" not in checks and "CUDA driver" not in checks and "NCCL" not in checks


# LUMI has SingularityCE's `singularity` and no `apptainer` command
# (https://docs.lumi-supercomputer.eu/software/containers/singularity/), and SingularityCE reads
# SINGULARITY_BIND (SingularityCE user guide, "Bind Paths and Mounts"): containers/sites/lumi.json's
# container_runtime. A fix naming apptainer there cannot be run as written.
def test_granted_gcds_that_torch_cannot_see_fail_naming_lumis_singularity_with_rocm(node):
    lumi_node(node)
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB,
                             FakeProbes(torch=dict(ROCM_TORCH, cuda_device_count=0)))
    assert code == 1 and checks["gpus"]["status"] == "FAIL"
    assert checks["gpus"]["fix"] == ("run with `singularity exec --rocm` (or `singularity run --rocm`) "
                                     "so the GPUs enter the container")


def test_nothing_bound_on_lumi_gives_the_singularity_bind_command(node):
    lumi_node(node, plugin=False)
    job = {k: v for k, v in LUMI_JOB.items() if k != "SINGULARITY_BIND"}
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], job, FakeProbes(torch=ROCM_TORCH))
    assert code == 1 and checks["OFI plugin"]["status"] == "FAIL"
    assert checks["OFI plugin"]["fix"] == (
        'nothing is bound (SINGULARITY_BIND is unset): on the host run export '
        'SINGULARITY_BIND="$(python3 -m ddp_launch.binds --site lumi)" (PYTHONPATH=<checkout>/entrypoints), '
        'then start the container again')
    assert "apptainer" not in " ".join(c["fix"] for c in checks.values()).lower()


def test_the_runtime_the_job_script_ran_wins_over_the_sites(node):
    # slurm/lib/ddp.sh exports DDP_CONTAINER_RUNTIME and runs the image with it; the container
    # sees the host's environment (Apptainer user guide, "Environment and Metadata").
    lumi_node(node)
    job = {**LUMI_JOB, "DDP_CONTAINER_RUNTIME": "apptainer"}
    _, checks, _ = doctor(node, ["--site", "lumi", "--offline"], job,
                          FakeProbes(torch=dict(ROCM_TORCH, cuda_device_count=0)))
    assert checks["gpus"]["fix"].startswith("run with `apptainer exec --rocm`")
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {**LUMI_JOB, "DDP_CONTAINER_RUNTIME": "podman"},
                          FakeProbes(torch=dict(ROCM_TORCH, cuda_device_count=0)))
    assert checks["gpus"]["fix"].startswith("run with `apptainer exec --nv`")  # olivia's own: Apptainer


def test_without_torch_the_gpus_are_counted_from_the_render_nodes_not_kfd_or_cards(node):
    lumi_node(node, gcds=6)
    _, checks, _ = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB, FakeProbes(torch={"version": "x"}))
    assert checks["gpus"]["status"] == "WARN"
    assert checks["gpus"]["detail"] == "6 GPUs visible (/dev/dri/renderD*), 8 granted"
    assert "ROCR_VISIBLE_DEVICES" in checks["gpus"]["fix"]


def test_a_missing_rccl_plugin_fails_and_names_aws_ofi_rccl(node):
    lumi_node(node, plugin=False)
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB, FakeProbes(torch=ROCM_TORCH))
    assert code == 1 and checks["OFI plugin"]["status"] == "FAIL"
    assert "aws-ofi-rccl" in checks["OFI plugin"]["fix"]


def test_no_amdgpu_module_skips_the_driver_check_with_the_file_it_read(node):
    node.net("eth0")
    _, checks, _ = doctor(node, ["--site", "lumi", "--offline"], {}, FakeProbes(torch=ROCM_TORCH))
    assert checks["HIP driver"]["status"] == "SKIP"
    assert checks["HIP driver"]["detail"] == "no AMD driver (/sys/module/amdgpu/version)"


def laifs_image(node):
    """What a LUMI AI Factory image holds (lumi-ai-factory/laifs-container-recipes): libcxi and
    libfabric built into /usr/lib/x86_64-linux-gnu (containerfiles/libfabric/Ubuntu_Rocm_Slingshot),
    ROCm's libraries in /opt/rocm/lib, listed by /etc/ld.so.conf.d/rocm-30.conf
    (containerfiles/rocm/Ubuntu2404_Rocm7), and Ubuntu's own ld.so.conf with its multiarch file.
    Real shared objects, libfabric linked to libcxi; nothing on LD_LIBRARY_PATH."""
    multiarch = node.root / "usr/lib/x86_64-linux-gnu"
    cxi = build_library(multiarch / "libcxi.so.1", "libcxi.so.1")
    fabric = build_library(multiarch / "libfabric.so.1", "libfabric.so.1", needs=[cxi],
                           source="unsigned int fi_version(void) { return (1u << 16) | 22u; }\n")
    build_library(node.root / "opt/rocm/lib/librccl.so.1", "librccl.so.1")
    build_library(node.root / "opt/rocm/lib/librccl-net.so", "librccl-net.so", needs=[fabric])
    node.file("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n\n")
    node.file("/etc/ld.so.conf.d/x86_64-linux-gnu.conf",
              "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    node.file("/etc/ld.so.conf.d/rocm-30.conf", "/opt/rocm/lib\n")


def test_a_lumi_image_whose_fabric_libraries_the_loader_cache_finds_passes_without_ld_library_path(node):
    """Apptainer resets LD_LIBRARY_PATH to /.singularity.d/libs (user guide, "Environment and
    Metadata"), so on LUMI-G the image's libraries are found as ld.so finds them: through
    /etc/ld.so.cache, built from ld.so.conf and its includes (ld.so(8), ldconfig(8))."""
    lumi_devices(node)
    laifs_image(node)
    env = dict(LUMI_JOB, LD_LIBRARY_PATH="/.singularity.d/libs")
    fake = FakeProbes(torch=ROCM_TORCH)
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], env, fake)
    assert code == 0, [c for c in checks.values() if c["status"] == "FAIL"]
    assert checks["libcxi"]["detail"] == "/usr/lib/x86_64-linux-gnu/libcxi.so.1 loads"
    assert checks["libfabric"]["detail"] == "/usr/lib/x86_64-linux-gnu/libfabric.so.1 loads (libfabric 2.3)"
    assert checks["OFI plugin"]["detail"] == "/opt/rocm/lib/librccl-net.so loads"
    assert str(node.root / "usr/lib/x86_64-linux-gnu/libfabric.so.1") in fake.loaded


def test_ld_library_path_comes_before_the_loader_cache_as_in_ld_so(node):
    lumi_devices(node)
    laifs_image(node)
    build_library(node.root / "opt/cray/libfabric/1.15.2.0/lib64/libfabric.so.1", "libfabric.so.1")
    env = dict(LUMI_JOB, LD_LIBRARY_PATH="/opt/cray/libfabric/1.15.2.0/lib64")
    _, checks, _ = doctor(node, ["--site", "lumi", "--offline"], env, FakeProbes(torch=ROCM_TORCH))
    assert checks["libfabric"]["detail"] == (
        "/opt/cray/libfabric/1.15.2.0/lib64/libfabric.so.1 loads (libfabric 2.3); "
        "also /usr/lib/x86_64-linux-gnu/libfabric.so.1 (later in ld.so's search, not used)")


def test_a_library_the_search_meets_twice_through_merged_usr_links_is_one_library(node):
    # Ubuntu's images have /lib -> usr/lib (merged /usr): ld.so.conf's /lib/x86_64-linux-gnu and
    # /usr/lib/x86_64-linux-gnu name one directory, and its libfabric shadows nothing.
    lumi_devices(node)
    laifs_image(node)
    (node.root / "lib").symlink_to("usr/lib")
    env = dict(LUMI_JOB, LD_LIBRARY_PATH="/.singularity.d/libs")
    _, checks, _ = doctor(node, ["--site", "lumi", "--offline"], env, FakeProbes(torch=ROCM_TORCH))
    assert checks["libfabric"]["detail"] == "/lib/x86_64-linux-gnu/libfabric.so.1 loads (libfabric 2.3)"
    assert checks["libcxi"]["detail"] == "/lib/x86_64-linux-gnu/libcxi.so.1 loads"


def test_a_library_nowhere_the_loader_looks_fails_naming_each_place_searched(node):
    lumi_devices(node)
    laifs_image(node)
    (node.root / "usr/lib/x86_64-linux-gnu/libcxi.so.1").unlink()
    env = dict(LUMI_JOB, LD_LIBRARY_PATH="/.singularity.d/libs")
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], env, FakeProbes(torch=ROCM_TORCH))
    assert code == 1 and checks["libcxi"]["status"] == "FAIL"
    detail = checks["libcxi"]["detail"]
    assert detail.startswith("not found where ld.so looks: LD_LIBRARY_PATH (/.singularity.d/libs); "
                             "/etc/ld.so.conf (/opt/rocm/lib:/usr/local/lib/x86_64-linux-gnu:"  # the include's glob, sorted
                             "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu); the default directories (")
    assert "/usr/lib64" in detail
