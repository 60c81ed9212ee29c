"""The GPU vendor as data (containers/sites/accelerators/*.json, ddp_launch.accelerators): each
vendor's documented words, the site profile's choice, bad files named in one line, and the
job scripts' questions (`python3 -m ddp_launch.accelerators --site SITE QUESTION`)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_launch import accelerators
from ddp_launch.accelerators import ACCELERATORS, load_accelerator, parse_accelerator, site_accelerator
from ddp_launch.errors import LaunchError
from ddp_launch.sites import load_site

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "containers" / "sites" / "accelerators"
NVIDIA = load_accelerator("nvidia", {})
AMD = load_accelerator("amd", {})


def test_nvidia_words_are_cudas():
    # CUDA C Programming Guide, CUDA Environment Variables; NVIDIA driver README, device files;
    # Apptainer user guide, GPU Support (https://apptainer.org/docs/user/main/gpu.html): --nv.
    assert NVIDIA.visible_variables == ("CUDA_VISIBLE_DEVICES",)
    assert (NVIDIA.driver_library, NVIDIA.driver_init, NVIDIA.driver_count) == ("libcuda.so.1", "cuInit", "cuDeviceGetCount")
    assert NVIDIA.apptainer_flag == "--nv" and NVIDIA.runtime == "CUDA"
    assert (NVIDIA.collective, NVIDIA.collective_library, NVIDIA.net_plugin) == ("NCCL", "libnccl.so.2", "libnccl-net.so")
    assert NVIDIA.driver_errors[100] == "CUDA_ERROR_NO_DEVICE"
    # CUDA Toolkit release notes, table 3: the oldest Linux driver for each CUDA major.
    assert NVIDIA.driver_minimum == {11: 450, 12: 525, 13: 580}
    assert "cuda-compat" in NVIDIA.driver_too_old_fix


def test_amd_words_are_rocms():
    # ROCm docs, GPU isolation techniques: ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES; Apptainer
    # user guide, GPU Support: --rocm; aws-ofi-rccl README: RCCL loads librccl-net.so.
    assert AMD.visible_variables == ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    assert (AMD.driver_library, AMD.driver_init, AMD.driver_count) == ("libamdhip64.so", "hipInit", "hipGetDeviceCount")
    assert AMD.apptainer_flag == "--rocm" and AMD.runtime == "HIP"
    assert (AMD.collective, AMD.collective_library, AMD.net_plugin, AMD.ofi_plugin) == \
        ("RCCL", "librccl.so.1", "librccl-net.so", "aws-ofi-rccl")
    assert AMD.driver_version_file == "/sys/module/amdgpu/version"
    assert AMD.plugin_dlopens is None and NVIDIA.plugin_dlopens == "libcudart.so"
    assert AMD.driver_minimum == {}  # no such table is published for HIP


@pytest.mark.parametrize("vendor, counted, ignored", [
    (NVIDIA, ["nvidia0", "nvidia15"], ["nvidiactl", "nvidia-uvm", "nvidia-caps", "renderD128"]),
    (AMD, ["renderD128", "renderD135"], ["card0", "kfd", "renderD", "nvidia0"]),
])
def test_device_files_count_one_per_gpu(vendor, counted, ignored):
    assert all(vendor.is_device_file(name) for name in counted)
    assert not any(vendor.is_device_file(name) for name in ignored)


def test_the_samplers_are_the_vendors_tools_with_the_period_filled_in():
    assert NVIDIA.sampler.words("5")[0] == "nvidia-smi" and NVIDIA.sampler.words("5")[-2:] == ("-l", "5")
    assert NVIDIA.sampler.repeats
    # rocm-smi has no repeat flag (ROCm SMI CLI help): the sampler loops, so no period in its words.
    assert AMD.sampler.words("5") == ("rocm-smi", "--showuse", "--showmemuse", "--showmeminfo", "vram",
                                      "--showpower", "--csv")
    assert not AMD.sampler.repeats


@pytest.mark.parametrize("name", ACCELERATORS)
def test_every_section_of_every_vendor_cites_a_public_source(name):
    vendor = load_accelerator(name, {})
    assert set(vendor.sources) == {"visible_devices", "device_files", "driver", "apptainer", "kubernetes",
                                   "collective", "sampler", "health"}
    for section in ("visible_devices", "driver", "apptainer", "sampler"):
        assert re.search(r"https://\S+", vendor.sources[section]), (name, section)
    assert "https://apptainer.org/docs/user/main/gpu.html" in vendor.sources["apptainer"]


@pytest.mark.parametrize("site, vendor", [("generic", "nvidia"), ("olivia", "nvidia"), ("raven", "nvidia"),
                                          ("rcp", "nvidia"), ("lumi", "amd"), (None, "nvidia")])
def test_the_site_profile_picks_the_vendor_and_absent_means_nvidia(site, vendor):
    assert site_accelerator(site, {}).name == vendor


def test_an_unknown_accelerator_name_is_refused():
    with pytest.raises(LaunchError, match="accelerator 'intel' is not known; use one of nvidia, amd"):
        load_accelerator("intel", {})


def _bad(change, tmp_path):
    document = json.loads((DATA / "amd.json").read_text())
    change(document)
    return parse_accelerator(document, str(tmp_path / "amd.json"))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(colour="red"), "unknown key(s) colour"),
    (lambda d: d.update(schema=2), "'schema' must be 1"),
    (lambda d: d.update(name="nvidia"), "'name' is 'nvidia' but the file is named amd.json"),
    (lambda d: d.pop("apptainer"), "'apptainer' must be an object"),
    (lambda d: d["apptainer"].update(flag=""), "'apptainer.flag' must be a non-empty string"),
    (lambda d: d["visible_devices"].update(variables=[]), "'visible_devices.variables' must be a non-empty list"),
    (lambda d: d["device_files"].update(pattern="renderD[0-9"), "'device_files.pattern' is not a regular expression"),
    (lambda d: d["driver"].update(errors={"x": "y"}), "'driver.errors' must map status codes"),
    (lambda d: d["driver"].update(minimum_for_runtime_major={"12": "525"}),
     "'driver.minimum_for_runtime_major' must map runtime majors"),
    (lambda d: d["sampler"].update(repeats=True), "repeats by itself, so one word must hold {interval}"),
    (lambda d: d["sampler"]["columns"].pop("utilization"), "'sampler.columns' must name a column for each of"),
    (lambda d: d["sampler"].update(memory_unit_bytes=True), "'sampler.memory_unit_bytes' must be a positive integer"),
    (lambda d: d["collective"].update(plugin_dlopens=5), "'plugin_dlopens' must be a non-empty string when given"),
    (lambda d: d["collective"].update(plugin_dlopens_dirs=["/usr/local/cuda/lib64", ""]),
     "'plugin_dlopens_dirs' must be a list of non-empty strings when given"),
    (lambda d: d["health"].update(format="csv"), "'health.format' must be one of nvidia-smi-xml, amd-smi-json, got 'csv'"),
    (lambda d: d["health"]["commands"][0].update(required=False), "'health.commands[0]' must be required"),
    (lambda d: d["health"]["commands"][1].update(argv="amd-smi bad-pages"),
     "'health.commands[1].argv' must be a non-empty list of strings"),
    (lambda d: d["health"]["rules"]["clock slowdown"]["signals"][0].update(fails_when="hot"),
     "'health.rules.clock slowdown.signals[].fails_when' must be one of above_zero, yes, active, entries, got 'hot'"),
    (lambda d: d["health"]["rules"]["uncorrectable ECC errors"].pop("source"),
     "'health.rules.uncorrectable ECC errors.source' must be a non-empty string"),
    (lambda d: d["health"]["temperature"]["limits"][0].update(slow_when="above"),
     "'health.temperature.limits[].slow_when' must be one of at_or_above, at_or_below, got 'above'"),
    (lambda d: d["health"]["rules"]["clock slowdown"].pop("kind"),
     "'health.rules.clock slowdown.kind' must be one of fault, state, got None"),
    (lambda d: d["health"].update(tool_missing_fix="use {image}"),
     "'health.tool_missing_fix' may hold only {runtime}, {runtime_env}"),
])
def test_a_bad_vendor_file_names_itself_and_the_key(change, message, tmp_path):
    with pytest.raises(LaunchError) as raised:
        _bad(change, tmp_path)
    assert str(raised.value).startswith(f"bad accelerator data {tmp_path / 'amd.json'}: ")
    assert message in str(raised.value)


def test_the_health_tools_are_the_vendors_documented_commands():
    # nvidia-smi(1): -q -x prints the XML of nvsmi_device_v12.dtd. AMD SMI's JSON, not rocm-smi's:
    # rocm-smi --json leaves out its RAS and retired-page tables (rocm_smi.py, printTableLog).
    assert [c.argv for c in NVIDIA.health.commands] == [("nvidia-smi", "-q", "-x")]
    assert NVIDIA.health.format == "nvidia-smi-xml" and NVIDIA.health.partitions == "mig_devices/mig_device"
    assert [c.argv[:2] for c in AMD.health.commands] == [("amd-smi", "metric"), ("amd-smi", "bad-pages"),
                                                          ("amd-smi", "static"), ("amd-smi", "metric")]
    assert [c.required for c in AMD.health.commands] == [True, False, False, False]
    assert all(c.argv[-1] == "--json" for c in AMD.health.commands)
    # Both element names NVIDIA drivers have used for the clock reasons (clocks_throttle_* before 535).
    slowdown = {s.path.split("/")[0] for r in NVIDIA.health.rules for s in r.signals if r.name == "clock slowdown"}
    assert slowdown == {"clocks_event_reasons", "clocks_throttle_reasons"}


def test_a_sites_dir_without_accelerators_falls_back_to_the_shipped_ones(tmp_path):
    (tmp_path / "mysite.json").write_text(json.dumps({"schema": 1, "name": "mysite", "fabric": "auto",
                                                      "accelerator": "amd", "binds": [], "env": {}}))
    env = {"DDP_SITES_DIR": str(tmp_path)}
    assert site_accelerator("mysite", env).path == str(DATA / "amd.json")


def test_a_missing_vendor_file_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(accelerators, "accelerator_dirs", lambda env: (str(tmp_path),))
    with pytest.raises(LaunchError, match=r"accelerators/amd.json not found \(searched .*\); restore"):
        load_accelerator("amd", {})


# -- the job scripts' questions ---------------------------------------------------------------

def ask(*argv, env=None):
    out = io.StringIO()
    code = accelerators.run(list(argv), env or {}, out)
    return code, out.getvalue()


@pytest.mark.parametrize("argv, expected", [
    (("--site", "lumi", "apptainer-flag"), "--rocm\n"),
    (("--site", "olivia", "apptainer-flag"), "--nv\n"),
    (("apptainer-flag",), "--nv\n"),
    (("--site", "lumi", "name"), "amd\n"),
    (("--site", "lumi", "sampler-repeats"), "0\n"),
    (("--site", "raven", "sampler-repeats"), "1\n"),
    (("--site", "raven", "--interval", "7", "sampler"),
     "nvidia-smi\n--query-gpu=timestamp,index,name,utilization.gpu,utilization.memory,memory.total,memory.used\n"
     "--format=csv,nounits\n-l\n7\n"),
])
def test_the_module_answers_one_word_a_line(argv, expected):
    assert ask(*argv) == (0, expected)


def test_ddp_site_is_the_default_site():
    assert ask("apptainer-flag", env={"DDP_SITE": "lumi"}) == (0, "--rocm\n")


def test_a_bad_question_or_site_is_one_line_and_exit_2():
    python = [sys.executable, "-m", "ddp_launch.accelerators"]
    for argv, text in ((["--site", "atlantis", "apptainer-flag"], "unknown site 'atlantis'"),
                       (["colour"], "invalid choice: 'colour'")):
        done = subprocess.run(python + argv, cwd=REPO / "entrypoints", capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and text in done.stderr


# -- LUMI's profile: the data the launcher reads there --------------------------------------

def test_lumi_binds_are_those_of_the_lumi_aif_singularity_bindings_module():
    # Lumi-supercomputer/LUMI-EasyBuild-contrib, easyconfigs/s/singularity-AI-bindings: SINGULARITY_BIND.
    module = ["/var/spool/slurmd", "/opt/cray", "/usr/lib64/libcxi.so.1", "/usr/lib64/libjansson.so.4",
              "/pfs", "/scratch", "/projappl", "/project", "/flash", "/appl"]
    profile = load_site("lumi", {})
    assert [(b.glob, b.target) for b in profile.binds] == [(path, path) for path in module]
    assert (profile.fabric, profile.accelerator, profile.gpu) == ("slingshot", "amd", "mi250x")


def test_lumi_env_is_the_rccl_interfaces_and_the_miopen_caches_in_tmp_and_no_gdr_level():
    profile = load_site("lumi", {})
    values = {item.name: item.value for item in profile.env}
    # No GDR level: None withholds the Slingshot default (laifs-container-recipes#28, #30; LUMI-AI-Guide PR #97).
    assert values == {"NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3", "NCCL_NET_GDR_LEVEL": None,
                      "MIOPEN_USER_DB_PATH": "/tmp/miopen-cache", "MIOPEN_CUSTOM_CACHE_DIR": "/tmp/miopen-cache"}
    assert all(item.source for item in profile.env)


def test_the_lumi_binds_resolve_on_a_host_that_has_the_paths(tmp_path):
    from ddp_launch import binds

    profile = load_site("lumi", {})
    for spec in profile.binds:
        target = tmp_path / spec.glob.lstrip("/")
        if spec.glob.endswith(".so.1") or spec.glob.endswith(".so.4"):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("stand-in\n")
        else:
            target.mkdir(parents=True, exist_ok=True)
    out, err = io.StringIO(), io.StringIO()
    assert binds.run(["--site", "lumi", "--root", str(tmp_path), "--quiet"], {}, out, err) == 0, err.getvalue()
    entries = out.getvalue().strip().split(",")
    assert entries[0] == f"{tmp_path}/var/spool/slurmd:/var/spool/slurmd" and len(entries) == 10
