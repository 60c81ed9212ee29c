"""`ddp-launch doctor` against fake nodes: every check's OK/WARN/FAIL, --json, exit codes."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys

import pytest
from fakes.elf_tree import bind_into, build_fake_olivia_host

from ddp_launch import binds as binds_cli
from ddp_launch.doctor import Probes, run
from ddp_launch.doctor.probes import real_run_command
from ddp_launch.libload import load_in_child

TORCH = {"version": "2.7.0a0+nv25.06", "cuda": "12.9", "nccl": "2.27.3", "cuda_device_count": 4}


class FakeProbes:
    """Records what doctor asked for; fails loudly on a library kind it does not know."""

    def __init__(self, torch=TORCH, refuse=(), fi_info=(0, "provider: cxi\n    fabric: cxi\n"), connect="refused", which=True,
                 missing=None, shm=16 << 30, health=None):
        self.shm = shm
        self.torch, self.refuse, self.fi_info, self.connect_result, self.has_fi_info = torch, refuse, fi_info, connect, which
        self.missing = missing or {}  # library file name -> the dependency dlopen cannot find
        # The GPU health tool's answers, argv -> (exit status, stdout, stderr), or a list of them, one
        # per reading (the last repeats); its tool is on PATH only when given (no nvidia-smi, as on a
        # CPU node, by default).
        self.health = health or {}
        self.loaded, self.commands, self.connected, self.child_loads, self.health_asked = [], [], [], [], []
        self.slept = []

    def load(self, path, kind):
        assert kind in ("plain", "libfabric", "nccl"), kind
        self.loaded.append(path)
        if any(path.endswith(name) for name in self.refuse):
            raise OSError(f"{path}: undefined symbol: fi_cxi_ext")
        return {"libfabric": "libfabric 2.3", "nccl": "NCCL 2.26.6"}.get(kind, "")

    def load_in_child(self, paths, library_path):
        self.child_loads.append((list(paths), library_path))
        return tuple((path, f"{self.missing[name]}: cannot open shared object file: No such file or directory"
                      if (name := path.rsplit("/", 1)[-1]) in self.missing else "") for path in paths)

    def run(self, argv):
        self.commands.append(list(argv))
        return self.fi_info

    def connect(self, address, port, timeout):
        self.connected.append((address, port))
        return self.connect_result

    def which(self, name):
        if name == "fi_info":
            return "/usr/bin/fi_info" if self.has_fi_info else None
        return f"/usr/bin/{name}" if any(argv[0] == name for argv in self.health) else None

    def read(self, argv):
        answer = self.health[tuple(argv)]  # a command the test did not answer fails it (KeyError)
        if isinstance(answer, list):
            answer = answer[min(self.health_asked.count(tuple(argv)), len(answer) - 1)]
        self.health_asked.append(tuple(argv))
        return answer

    def sleep(self, seconds):
        self.slept.append(seconds)

    def probes(self):
        return Probes(lambda: self.torch, self.load, self.run, self.connect, self.which, self.load_in_child,
                      lambda path: self.shm, self.read, self.sleep)


def doctor(node, argv=(), env=None, fake=None):
    fake = fake or FakeProbes()
    out = io.StringIO()
    code = run(["--root", str(node.root), "--json", *argv], env or {}, out, fake.probes())
    report = json.loads(out.getvalue())
    return code, {c["name"]: c for c in report["checks"]}, report


def olivia_node(node, plugin=True, cudart=True, cxi=True):
    if cxi:
        node.cxi(4)
    node.file("/opt/host-libs/libcxi.so.1")
    node.file("/opt/libfabric/lib64/libfabric.so.1")
    node.file("/opt/nccl/lib/libnccl.so.2")
    if plugin:
        node.file("/opt/aws-ofi-nccl/lib/libnccl-net.so")
    if cudart:
        node.file("/usr/local/cuda/lib64/libcudart.so")
    for index in range(4):
        node.file(f"/dev/nvidia{index}")
    node.file("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.124.06  Release Build\n")


# Node 0 of a 2-node Olivia step (srun --ntasks-per-node=1), as SLURM sets it; the planner reads it.
JOB = {
    "SLURM_JOB_ID": "771234", "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "olivia-gh[001-002]", "SLURM_STEP_NODELIST": "olivia-gh[001-002]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    "SLURMD_NODENAME": "olivia-gh001", "SLURM_GPUS_ON_NODE": "4", "CUDA_VERSION": "12.9.1",
}
# A RunAI / Kubeflow worker pod: the master's address and port come from the operator.
WORKER_POD = {"PET_NNODES": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29511"}


def test_healthy_olivia_node_passes(node):
    olivia_node(node)
    code, checks, report = doctor(node, ["--site", "olivia", "--offline"], JOB)
    assert code == 0 and report["ok"]
    assert checks["OFI plugin"]["status"] == "OK"
    assert "/opt/aws-ofi-nccl/lib/libnccl-net.so loads" in checks["OFI plugin"]["detail"]
    assert checks["libfabric"]["detail"].endswith("(libfabric 2.3)")
    assert checks["fi_info -p cxi"]["status"] == "OK"
    assert checks["interface"]["detail"] == "NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3"


def test_missing_plugin_fails_in_a_multi_node_job(node):
    olivia_node(node, plugin=False)
    code, checks, report = doctor(node, ["--site", "olivia", "--offline"], {**JOB, "APPTAINER_BIND": "/opt/cray"})
    assert code == 1 and not report["ok"]
    assert checks["OFI plugin"]["status"] == "FAIL"
    assert "aws-ofi-nccl" in checks["OFI plugin"]["fix"]


def test_missing_plugin_off_a_slingshot_node_outside_a_job_only_warns(node):
    # A login node without CXI devices, or the image's %test: nothing to train across yet.
    olivia_node(node, plugin=False, cxi=False)
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {})
    assert checks["OFI plugin"]["status"] == "WARN"


def test_nothing_bound_on_a_slingshot_node_fails_and_prints_the_binds_command(node):
    # `apptainer exec --nv train.sif ddp-launch doctor --site olivia` on a GH200 node without
    # APPTAINER_BIND: no host library is in the container. Apptainer sets APPTAINER_BIND inside
    # the container to what was bound (user guide appendix, "Apptainer's environment variables",
    # https://apptainer.org/docs/user/main/appendix.html), so unset means nothing was.
    node.cxi(4)
    out = io.StringIO()
    code = run(["--root", str(node.root), "--site", "olivia", "--offline"], {}, out, FakeProbes().probes())
    text = out.getvalue()
    assert code == 1 and "doctor: no failures" not in text
    for label in ("libcxi", "libfabric", "OFI plugin"):
        assert f"FAIL  {label}: not found where ld.so looks: LD_LIBRARY_PATH" in text
    assert 'export APPTAINER_BIND="$(python3 -m ddp_launch.binds --site olivia)"' in text


def test_with_binds_the_fix_names_the_library_not_the_binds_command(node):
    node.cxi(4)
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {"APPTAINER_BIND": "/opt/cray:/opt/cray"})
    assert checks["libcxi"]["status"] == "FAIL" and "APPTAINER_BIND" not in checks["libcxi"]["fix"]


def test_library_that_does_not_load_fails_with_the_loader_message(node):
    olivia_node(node)
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB, FakeProbes(refuse=("libnccl-net.so",)))
    assert code == 1
    assert "undefined symbol: fi_cxi_ext" in checks["OFI plugin"]["detail"]


def test_plugin_is_loaded_after_its_dependencies(node):
    olivia_node(node)
    fake = FakeProbes()
    doctor(node, ["--site", "olivia", "--offline"], JOB, fake)
    names = [path.rsplit("/", 1)[-1] for path in fake.loaded]
    assert names.index("libcxi.so.1") < names.index("libfabric.so.1") < names.index("libnccl-net.so")


def test_missing_unversioned_cudart_warns(node):
    olivia_node(node, cudart=False)
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB)
    assert checks["libcudart.so"]["status"] == "WARN"


def test_fi_info_failure_fails(node):
    olivia_node(node)
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB, FakeProbes(fi_info=(61, "fi_getinfo: -61 (No data available)\n")))
    assert code == 1 and checks["fi_info -p cxi"]["detail"] == "exit 61: fi_getinfo: -61 (No data available)"


def test_gpus_granted_but_invisible_fails(node):
    node.net("eth0")
    code, checks, _ = doctor(node, ["--offline"], {"SLURM_GPUS_ON_NODE": "4"}, FakeProbes(torch=dict(TORCH, cuda_device_count=0)))
    assert code == 1 and "--nv" in checks["gpus"]["fix"]


def test_gpus_granted_but_invisible_only_warn_when_the_workers_run_on_cpu_on_purpose(node):
    # The launcher starts CPU workers on a node with granted GPUs when asked to (grant_to_check); a
    # preflight that failed every such node would stop the job it lets run.
    node.net("eth0")
    env = {"SLURM_GPUS_ON_NODE": "4", "DDP_LAUNCH_CPU_WORKERS": "2"}
    code, checks, _ = doctor(node, ["--offline"], env, FakeProbes(torch=dict(TORCH, cuda_device_count=0)))
    assert code == 0 and checks["gpus"]["status"] == "WARN"
    assert checks["gpus"]["detail"] == ("0 GPUs visible (torch.cuda.device_count()), 4 granted; the workers run on "
                                        "CPU as DDP_LAUNCH_CPU_WORKERS=2 asks")
    assert "unset DDP_LAUNCH_CPU_WORKERS" in checks["gpus"]["fix"]


def test_gpu_count_mismatch_warns(node):
    node.net("eth0")
    _, checks, _ = doctor(node, ["--offline"], {"SLURM_GPUS_ON_NODE": "4"}, FakeProbes(torch=dict(TORCH, cuda_device_count=2)))
    assert checks["gpus"]["status"] == "WARN"


def test_no_torch_fails(node):
    node.net("eth0")
    code, checks, _ = doctor(node, ["--offline"], {}, FakeProbes(torch=None))
    assert code == 1 and checks["torch"]["status"] == "FAIL"


def test_old_driver_for_the_image_cuda_warns(node):
    node.file("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01  Tue Oct 26 2021\n")
    _, checks, _ = doctor(node, ["--offline"], {"CUDA_VERSION": "12.9.1"})
    assert checks["CUDA driver"]["status"] == "WARN" and "470.82" in checks["CUDA driver"]["detail"]
    assert "(>= 525)" in checks["CUDA driver"]["detail"] and "cuda-compat" in checks["CUDA driver"]["fix"]


def test_a_driver_at_the_published_minimum_runs_the_images_cuda(node):
    node.file("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  525.60.13  Wed Nov 30 2022\n")
    _, checks, _ = doctor(node, ["--offline"], {"CUDA_VERSION": "12.9.1"})
    assert checks["CUDA driver"]["status"] == "OK", checks["CUDA driver"]


def test_slingshot_expected_but_no_devices_fails_in_a_job(node):
    node.net("eth0")
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB)
    assert code == 1 and checks["fabric devices"]["status"] == "FAIL"


def test_socket_ifname_naming_a_missing_interface_fails(node):
    node.net("eth0", "lo")
    code, checks, _ = doctor(node, ["--offline"], {"NCCL_SOCKET_IFNAME": "ib0"})
    assert code == 1 and "matches no interface" in checks["interface"]["detail"]


def test_loopback_socket_interface_fails_in_a_multi_node_job(node):
    # Rank 0 advertises NCCL_SOCKET_IFNAME's address to its peers (NCCL environment variables,
    # NCCL_SOCKET_IFNAME: "the IP interface to use for communication"): loopback reaches no peer.
    node.net("eth0", "lo")
    node.route()
    code, checks, _ = doctor(node, ["--offline"], {**JOB, "NCCL_SOCKET_IFNAME": "lo"})
    assert code == 1 and checks["interface"]["status"] == "FAIL"
    assert "loopback" in checks["interface"]["detail"]


def test_loopback_socket_interface_outside_a_job_warns(node):
    node.net("eth0", "lo")
    _, checks, _ = doctor(node, ["--offline"], {"NCCL_SOCKET_IFNAME": "lo"})
    assert checks["interface"]["status"] == "WARN" and "is loopback" in checks["interface"]["detail"]


def test_head_node_reachable_with_port_closed_is_ok(node):
    fake = FakeProbes(connect="refused")
    _, checks, _ = doctor(node, [], WORKER_POD, fake)
    assert checks["head node"]["status"] == "OK"
    assert fake.connected == [("10.0.0.5", 29511)]


def test_head_node_port_timeout_fails(node):
    code, checks, _ = doctor(node, [], WORKER_POD, FakeProbes(connect="no answer within 3 s"))
    assert code == 1 and checks["head node"]["status"] == "FAIL"


def test_head_node_from_slurm_nodelist_and_job_port(node):
    fake = FakeProbes()
    _, checks, _ = doctor(node, [], {"SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "1234"}, fake)
    assert fake.connected == [("127.0.0.1", 20000 + 234 * 10)]
    assert checks["head node"]["detail"].startswith("localhost (127.0.0.1) reachable")


def test_head_node_is_the_steps_first_node_on_the_steps_port_as_the_launcher_plans(node):
    # The step runs on a subset of the job's nodes: the launcher meets on the step's first node.
    step = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "3", "SLURM_JOB_NODELIST": "gone-node,localhost",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_NUM_NODES": "1",
            "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_NODEID": "0"}
    fake = FakeProbes()
    _, checks, _ = doctor(node, [], step, fake)
    assert fake.connected == [("127.0.0.1", 20000 + 234 * 10 + 3)], checks["head node"]


def test_a_launch_the_planner_refuses_is_one_failed_check_and_the_rest_still_run(node):
    batch_script = {key: value for key, value in JOB.items() if "STEP" not in key}  # sbatch, not srun
    code, checks, _ = doctor(node, ["--offline"], batch_script)
    assert code == 1 and checks["launch plan"]["status"] == "FAIL"
    assert "start it with srun (SLURM_STEP_ID is unset)" in checks["launch plan"]["detail"]
    assert "\n" not in checks["launch plan"]["detail"]
    assert checks["head node"]["status"] == "SKIP" and checks["gpus"]["status"] == "OK"


def test_the_launch_plan_check_says_what_the_launcher_would_do(node):
    _, checks, _ = doctor(node, [], WORKER_POD, FakeProbes())
    assert checks["launch plan"] == {"name": "launch plan", "status": "OK",
                                     "detail": "kubeflow on 2 node(s), rendezvous 10.0.0.5:29511", "fix": ""}


def test_no_route_to_the_head_on_ethernet_warns_about_the_interface(node):
    node.net("eth0", "lo")
    node.route("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n")
    _, checks, _ = doctor(node, [], WORKER_POD, FakeProbes())
    assert checks["interface"]["status"] == "WARN"
    assert checks["interface"]["detail"] == ("no route to head node 10.0.0.5 in /proc/net/route; "
                                             "socket interface left to NCCL/Gloo")


def test_offline_skips_the_network(node):
    fake = FakeProbes()
    _, checks, _ = doctor(node, ["--offline"], {"MASTER_ADDR": "127.0.0.1"}, fake)
    assert checks["head node"]["status"] == "SKIP" and fake.connected == []


def test_a_64_mib_dev_shm_fails_where_several_gpus_share_it(node):
    # Kubernetes pods get the runtime's 64 MiB /dev/shm (kubernetes#28272); NCCL between GPUs
    # needs more (NCCL troubleshooting, "Shared memory": --shm-size=1g,
    # https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html).
    code, checks, _ = doctor(node, ["--offline"], {}, FakeProbes(shm=64 << 20))
    assert code == 1 and checks["/dev/shm"]["status"] == "FAIL"
    assert checks["/dev/shm"]["detail"] == "64 MiB, and NCCL between the 4 GPUs here needs at least 1 GiB"
    assert "--large-shm" in checks["/dev/shm"]["fix"]


def test_a_small_dev_shm_with_one_gpu_is_ok(node):
    _, checks, _ = doctor(node, ["--offline"], {}, FakeProbes(torch=dict(TORCH, cuda_device_count=1), shm=64 << 20))
    assert checks["/dev/shm"]["status"] == "OK"


def test_dataset_present_is_ok(node, tmp_path):
    data = tmp_path / "data" / "cifar-100-python"
    data.mkdir(parents=True)
    for name in ("train", "test", "meta"):
        (data / name).write_bytes(b"x")
    _, checks, _ = doctor(node, ["--offline", "--data-dir", str(tmp_path / "data")])
    assert checks["dataset"]["status"] == "OK"


def test_dataset_missing_warns_with_the_fix(node, tmp_path):
    _, checks, _ = doctor(node, ["--offline", "--data-dir", str(tmp_path)])
    assert checks["dataset"]["status"] == "WARN" and "make data" in checks["dataset"]["fix"]


def test_text_output_shows_fix_lines(node):
    out = io.StringIO()
    node.net("eth0")
    code = run(["--root", str(node.root), "--offline"], {"SLURM_GPUS_ON_NODE": "4"}, out, FakeProbes(torch=dict(TORCH, cuda_device_count=0)).probes())
    text = out.getvalue()
    assert code == 1
    assert "FAIL  gpus: 0 GPUs visible (torch.cuda.device_count()) but 4 granted" in text
    assert "      fix: run with `apptainer exec --nv`" in text
    assert text.rstrip().endswith("doctor: 1 failed")


def test_doctor_cli_unknown_site_is_one_line_exit_2():
    result = subprocess.run([sys.executable, "-m", "ddp_launch", "doctor", "--offline", "--site", "atlantis"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("ddp-launch: error: unknown site 'atlantis'")
    assert len(result.stderr.strip().splitlines()) == 1


def test_doctor_cli_runs_for_real_offline(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ddp_launch", "doctor", "--offline", "--json", "--data-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], result.stdout
    assert {c["name"] for c in report["checks"]} >= {"gpus", "torch", "fabric devices", "dataset"}


def test_plugin_named_only_ofi_warns_that_nccl_will_not_find_it(node):
    olivia_node(node, plugin=False)
    node.file("/opt/aws-ofi-nccl/lib/libnccl-net-ofi.so")
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB)
    assert checks["OFI plugin"]["status"] == "WARN" and "libnccl-net-ofi.so" in checks["OFI plugin"]["detail"]


def test_no_hsn_interface_on_slingshot_warns(node):
    node.file("/dev/cxi0")
    node.net("eth0", "lo")
    _, checks, _ = doctor(node, ["--offline"], {})
    assert checks["interface"]["status"] == "WARN" and "no hsn* interface" in checks["interface"]["detail"]


def test_nccl_net_with_nccl_net_plugin_fails(node):
    node.cxi(1)
    code, checks, _ = doctor(node, ["--offline"], {"NCCL_NET": "AWS Libfabric", "NCCL_NET_PLUGIN": "ofi"})
    assert code == 1 and "unset NCCL_NET_PLUGIN" in checks["fabric settings"]["fix"]


# --- bound host libraries and their dependencies, with real cc-built objects -------------

@pytest.fixture(scope="module")
def olivia_binds(tmp_path_factory):
    """A fake Olivia host (elf_tree.py) and the APPTAINER_BIND value `ddp-launch binds` makes for it."""
    host = build_fake_olivia_host(tmp_path_factory.mktemp("olivia") / "host")
    out, err = io.StringIO(), io.StringIO()
    assert binds_cli.run(["--site", "olivia", "--root", str(host["root"])], {}, out, err) == 0, err.getvalue()
    return out.getvalue().strip()


def real_loading_probes(fake: FakeProbes, run_command=None) -> Probes:
    """The fake probes, but libraries load for real in a child process (and fi_info runs, if asked)."""
    return dataclasses.replace(fake.probes(), load_in_child=load_in_child, run_command=run_command or fake.run)


def doctor_with(node, probes, env=JOB):
    out = io.StringIO()
    code = run(["--root", str(node.root), "--json", "--site", "olivia", "--offline"], env, out, probes)
    return code, {c["name"]: c for c in json.loads(out.getvalue())["checks"]}


def test_bound_libraries_load_with_their_host_dependencies(node, olivia_binds):
    node.cxi(4)
    bind_into(node.root, olivia_binds)
    code, checks = doctor_with(node, real_loading_probes(FakeProbes()))
    check = checks["library dependencies"]
    assert check["status"] == "OK", check
    assert check["detail"].startswith("9 bound libraries load")  # libfabric, libnccl, plugin; libcxi + 5 in /opt/host-libs


def test_binds_without_the_dependencies_name_the_missing_library(node, olivia_binds):
    """What the old `ddp-launch binds` gave: libcxi.so.1 alone in /opt/host-libs."""
    node.cxi(4)
    old = [e for e in olivia_binds.split(",") if ":/opt/host-libs/" not in e or e.endswith(":/opt/host-libs/libcxi.so.1")]
    bind_into(node.root, ",".join(old))
    code, checks = doctor_with(node, real_loading_probes(FakeProbes()))
    check = checks["library dependencies"]
    assert code == 1 and check["status"] == "FAIL"
    assert "libfakenl-3.so.200 is missing (needed to load libcxi.so.1)" in check["detail"]
    assert "ddp-launch binds --site olivia" in check["fix"]


def test_one_removed_dependency_is_named_with_the_libraries_it_breaks(node, olivia_binds):
    node.cxi(4)
    bind_into(node.root, olivia_binds)
    (node.root / "opt/host-libs/libfakeudev.so.1").unlink()
    _, checks = doctor_with(node, real_loading_probes(FakeProbes()))
    detail = checks["library dependencies"]["detail"]
    assert detail.startswith("libfakeudev.so.1 is missing (needed to load ")
    assert "libnccl-net.so" in detail and "libfakehwloc.so.15" in detail and "libcxi.so.1" not in detail


def test_missing_dependency_outside_a_job_only_warns(node, olivia_binds):
    bind_into(node.root, olivia_binds)
    (node.root / "opt/host-libs/libfakejson.so.5").unlink()
    _, checks = doctor_with(node, real_loading_probes(FakeProbes()), env={})
    assert checks["library dependencies"]["status"] == "WARN"


def test_no_bound_libraries_skips_the_dependency_check(node):
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {})
    assert checks["library dependencies"]["status"] == "SKIP"


def test_fi_info_from_the_bound_libfabric_runs_though_not_on_path(node, olivia_binds):
    node.cxi(4)
    bind_into(node.root, olivia_binds)
    probes = real_loading_probes(FakeProbes(which=False), run_command=real_run_command)
    _, checks = doctor_with(node, probes)
    assert checks["fi_info -p cxi"]["status"] == "OK"
    assert checks["fi_info -p cxi"]["detail"] == "provider: cxi"


def test_bound_fi_info_comes_before_path_and_gets_the_library_path(node):
    olivia_node(node)
    node.file("/opt/libfabric/bin/fi_info").chmod(0o755)
    fake = FakeProbes(which=True)
    doctor(node, ["--site", "olivia", "--offline"], JOB, fake)
    argv = fake.commands[0]
    assert argv[-3:] == [f"{node.root}/opt/libfabric/bin/fi_info", "-p", "cxi"]
    assert argv[0] == "env" and argv[1].startswith("LD_LIBRARY_PATH=") and f"{node.root}/opt/host-libs" in argv[1]


def test_fi_info_on_path_is_the_fallback(node):
    olivia_node(node)
    fake = FakeProbes(which=True)
    doctor(node, ["--site", "olivia", "--offline"], JOB, fake)
    assert fake.commands[0][-3:] == ["/usr/bin/fi_info", "-p", "cxi"]


def test_no_fi_info_anywhere_skips_and_says_where_it_looked(node):
    olivia_node(node)
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB, FakeProbes(which=False))
    assert checks["fi_info -p cxi"]["status"] == "SKIP"
    assert "/opt/libfabric/bin" in checks["fi_info -p cxi"]["detail"]


def test_host_libraries_are_found_when_the_image_sets_its_own_library_path(node):
    """NGC images set LD_LIBRARY_PATH; the launcher merges the site's dirs into it, and so must doctor."""
    olivia_node(node)
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], dict(JOB, LD_LIBRARY_PATH="/usr/local/nvidia/lib64"))
    assert checks["libcxi"]["status"] == "OK", checks["libcxi"]


def test_load_failure_names_the_missing_dependency(node):
    olivia_node(node)
    fake = FakeProbes()
    fake.load = lambda path, kind: (_ for _ in ()).throw(OSError("libfakejson.so.5: cannot open shared object file: No such file or directory"))
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB, fake)
    assert "libfakejson.so.5 is missing (needed to load libcxi.so.1)" in checks["libcxi"]["detail"]


def test_a_library_without_its_version_symbol_loads_with_version_unknown(tmp_path):
    # A real shared object named like NCCL but without ncclGetVersion: no AttributeError.
    import shutil as _shutil
    import subprocess as _subprocess

    from ddp_launch.doctor.probes import real_load_library

    cc = _shutil.which("cc")
    assert cc, "cc is needed to build the test library (apt-get install gcc)"
    source = tmp_path / "stub.c"
    source.write_text("int ddp_stub_marker(void) { return 1; }\n")
    library = tmp_path / "libnccl.so.2"
    _subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)

    assert real_load_library(str(library), "nccl") == "version unknown: no ncclGetVersion in it"
    assert real_load_library(str(library), "libfabric") == "version unknown: no fi_version in it"


@pytest.mark.parametrize("name", ["SLURM_GPUS_ON_NODE", "RUNAI_NUM_OF_GPUS"])
def test_a_bad_gpu_count_is_named_by_the_variable_it_came_from(node, name):
    # A RunAI pod has RUNAI_NUM_OF_GPUS (fractional GPUs read "0.5") and no SLURM variables.
    node.net("eth0")
    code, checks, _ = doctor(node, ["--offline"], {name: "0.5"})
    assert code == 1
    assert checks["gpus"]["status"] == "FAIL"
    assert f"{name}='0.5'" in checks["gpus"]["detail"]
    other = {"SLURM_GPUS_ON_NODE", "RUNAI_NUM_OF_GPUS"} - {name}
    assert other.pop() not in checks["gpus"]["detail"]
