"""The doctor's GPU health check against the vendors' own output formats: nvidia-smi -q -x (the XML of
nvsmi_device_v12.dtd) and amd-smi --json, one document per failure in data/gpu-health/, written to
those schemas; the rules and their sources are in containers/sites/accelerators/<vendor>.json."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from test_doctor import JOB, FakeProbes, doctor
from test_doctor_amd import LUMI_JOB, ROCM_TORCH, lumi_node

from ddp_contract import EXIT_BAD_NODE, quarantine
from ddp_launch.accelerators import load_accelerator
from ddp_launch.doctor import run
from ddp_launch.doctor.gpu_health import fails, number, value_at
from ddp_launch.doctor.probes import real_read_command

DATA = Path(__file__).parent / "data" / "gpu-health"
FAKE_BIN = DATA / "bin"
NVIDIA_SMI = ("nvidia-smi", "-q", "-x")
AMD_SMI = {  # the commands of amd.json's health section, and the file each case keeps its answer in
    ("amd-smi", "metric", "--ecc", "--temperature", "--json"): "metric",
    ("amd-smi", "bad-pages", "--pending", "--un-res", "--json"): "bad-pages",
    ("amd-smi", "static", "--limit", "--json"): "static-limit",
    ("amd-smi", "metric", "--throttle", "--json"): "throttle",
}
GRANTED_4 = {"SLURM_GPUS_ON_NODE": "4"}


def nvidia(case: str, code: int = 0, stderr: str = "") -> dict:
    return {NVIDIA_SMI: (code, (DATA / "nvidia" / f"{case}.xml").read_text(), stderr)}


def amd(case: str) -> dict:
    """Each amd-smi command's answer for the case; a command the case does not change answers as healthy."""
    answers = {}
    for argv, name in AMD_SMI.items():
        path = DATA / "amd" / case / f"{name}.json"
        answers[argv] = (0, (path if path.exists() else DATA / "amd" / "healthy" / f"{name}.json").read_text(), "")
    return answers


def health_check(node, health, env=GRANTED_4, argv=("--offline",)):
    fake = FakeProbes(health=health)
    code, checks, report = doctor(node, list(argv), env, fake)
    return code, checks["gpu health"], report


# -- NVIDIA: one document per failure --------------------------------------------------------

def test_healthy_gpus_pass_and_say_what_was_read(node):
    code, check, report = health_check(node, nvidia("healthy"))
    assert code == 0 and report["ok"]
    assert check == {"name": "gpu health", "status": "OK", "fix": "",
                     "detail": "4 GPU(s) listed by nvidia-smi, 4 granted; none has uncorrectable ECC errors, "
                               "pending or failed memory repair, clock slowdown, temperature over its slowdown limit"}


@pytest.mark.parametrize("case, detail", [
    # DCGM_FR_VOLATILE_DBE_DETECTED: any volatile uncorrectable ECC error fails the GPU.
    ("ecc", "uncorrectable ECC errors: GPU 2 (00000029:01:00.0) ecc_errors/volatile/dram_uncorrectable=2"),
    # DCGM diagnostics (Software.cpp checkRowRemapping) and NHC check_gpu_ecc: pending or failed remaps.
    ("remap-pending", "pending or failed memory repair: GPU 1 (00000019:01:00.0) remapped_rows/remapped_row_pending=Yes"),
    ("remap-failure", "pending or failed memory repair: GPU 3 (00000039:01:00.0) remapped_rows/remapped_row_failure=Yes"),
    # Pre-Ampere GPUs retire pages; the element was pending_blacklist, then pending_retirement: both are read.
    ("retired-pending", "pending or failed memory repair: GPU 2 (00000000:CA:00.0) retired_pages/pending_blacklist=Yes "
                        "retired_pages/pending_retirement=Yes"),
    # NVML clocks event reasons: HW slowdown and the thermal slowdowns are faults.
    ("hw-slowdown", "clock slowdown: GPU 0 (00000009:01:00.0) clocks_event_reasons/clocks_event_reason_hw_slowdown=Active"),
    ("thermal-slowdown", "clock slowdown: GPU 0 (00000009:01:00.0) "
                         "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown=Active "
                         "clocks_event_reasons/clocks_event_reason_sw_thermal_slowdown=Active"),
    # Drivers before 535 name the same reasons clocks_throttle_reason_*.
    ("old-throttle", "clock slowdown: GPU 0 (00000000:31:00.0) "
                     "clocks_throttle_reasons/clocks_throttle_reason_hw_slowdown=Active"),
    # The GPU's own slowdown temperature, absolute (A100) ...
    ("hot", "temperature over its slowdown limit: GPU 3 (00000000:E3:00.0) temperature/gpu_temp=91 >= its slowdown "
            "temperature/gpu_temp_slow_threshold=89"),
    # ... and fewer GPUs than the scheduler granted (NHC check_gpu_count).
    ("fewer", "fewer GPUs than granted: nvidia-smi lists 3 GPU(s), SLURM_GPUS_ON_NODE=4 granted 4"),
])
def test_each_documented_failure_fails_the_node_naming_the_gpu_and_the_element(node, case, detail):
    code, check, report = health_check(node, nvidia(case))
    assert code == 1 and not report["ok"]
    assert check["status"] == "FAIL" and check["detail"] == detail
    assert "quarantine" in check["fix"]


def test_hopper_headroom_at_its_slowdown_margin_is_over_the_limit(node):
    # Hopper drivers report T.Limit temperatures: headroom below the limit, slowdown at -2 C of it.
    _, check, _ = health_check(node, nvidia("hot-tlimit"))
    assert check["status"] == "FAIL"
    assert ("temperature over its slowdown limit: GPU 1 (00000019:01:00.0) temperature/gpu_temp_tlimit=-3 <= its "
            "slowdown temperature/gpu_temp_slow_tlimit_threshold=-2") in check["detail"]


def test_idle_and_power_capped_gpus_are_not_throttled(node):
    # SW power cap is the limit the site set, GPU idle is no work: NHC accepts both, so do we.
    _, check, _ = health_check(node, nvidia("power-capped"))
    assert check["status"] == "OK"


def test_blackwells_split_sram_counters_are_read_too(node):
    # nvsmi_device_v13 splits volatile SRAM uncorrectable into _parity and _secded.
    text = (DATA / "nvidia" / "healthy.xml").read_text().replace(
        "<sram_uncorrectable>0</sram_uncorrectable>",
        "<sram_uncorrectable_parity>0</sram_uncorrectable_parity><sram_uncorrectable_secded>1</sram_uncorrectable_secded>", 1)
    _, check, _ = health_check(node, {NVIDIA_SMI: (0, text, "")})
    assert check["detail"] == ("uncorrectable ECC errors: GPU 0 (00000009:01:00.0) "
                               "ecc_errors/volatile/sram_uncorrectable_secded=1")


def test_aggregate_dram_errors_alone_do_not_fail(node):
    # Lifetime DRAM counts were handled by remapping; DCGM fails only the volatile ones.
    text = (DATA / "nvidia" / "healthy.xml").read_text().replace(
        "<dram_correctable>3</dram_correctable>\n\t\t\t\t<dram_uncorrectable>0</dram_uncorrectable>",
        "<dram_correctable>3</dram_correctable>\n\t\t\t\t<dram_uncorrectable>5</dram_uncorrectable>")
    assert "<dram_uncorrectable>5</dram_uncorrectable>" in text
    _, check, _ = health_check(node, {NVIDIA_SMI: (0, text, "")})
    assert check["status"] == "OK"


def test_a_mig_gpu_counts_as_its_mig_devices_and_its_n_a_rows_are_no_failure(node):
    # With MIG on, SLURM grants MIG devices, and NVML reports remapped rows for the whole GPU as N/A.
    code, check, _ = health_check(node, nvidia("mig"))
    assert code == 0 and check["status"] == "OK"
    assert check["detail"].startswith("1 GPU(s) (4 devices to grant) listed by nvidia-smi, 4 granted")


def test_fields_a_gpu_does_not_report_are_named_not_failed(node):
    # Every health field N/A (a board without ECC or clock reasons, say): no failure, and the detail
    # says what was not read (nvidia-smi(1): unsupported data is "N/A").
    text = (DATA / "nvidia" / "fewer.xml").read_text()
    for tag in ("dram_uncorrectable", "sram_uncorrectable", "remapped_row_pending", "remapped_row_failure",
                "clocks_event_reason_hw_slowdown", "clocks_event_reason_hw_thermal_slowdown",
                "clocks_event_reason_hw_power_brake_slowdown", "clocks_event_reason_sw_thermal_slowdown",
                "gpu_temp_tlimit"):
        text = re.sub(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>N/A</{tag}>", text)
    _, check, _ = health_check(node, {NVIDIA_SMI: (0, text, "")}, env={})
    assert check["status"] == "OK"
    assert check["detail"] == ("3 GPU(s) listed by nvidia-smi; not reported by these GPUs: uncorrectable ECC errors, "
                               "pending or failed memory repair, clock slowdown, temperature over its slowdown limit")


def test_fewer_gpus_without_a_grant_is_no_failure(node):
    # Nothing to compare with: a node outside a job, or a pod the operator gave no count.
    _, check, _ = health_check(node, nvidia("fewer"), env={})
    assert check["status"] == "OK" and check["detail"].startswith("3 GPU(s) listed by nvidia-smi; none has")


def test_the_grant_comes_from_the_launchers_own_variables(node):
    # ddp_launch.gpus: a step's CUDA_VISIBLE_DEVICES (SLURM's gres) counts when SLURM_GPUS_ON_NODE is unset.
    _, check, _ = health_check(node, nvidia("fewer"), env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert check["detail"] == ("fewer GPUs than granted: nvidia-smi lists 3 GPU(s), "
                               "CUDA_VISIBLE_DEVICES=0,1,2,3 granted 4")


# -- the tool missing or failing: a result, not a traceback -------------------------------------

def test_a_cpu_node_without_gpus_or_nvidia_smi_is_skipped(node):
    # The e2e cluster's jobs: sbatch --gpus-per-node=0, CPU workers, no nvidia-smi in the image.
    env = {**JOB, "SLURM_GPUS_ON_NODE": "0", "DDP_LAUNCH_CPU_WORKERS": "2"}
    code, check, _ = health_check(node, {}, env=env, argv=("--offline", "--site", "generic"))
    assert check == {"name": "gpu health", "status": "SKIP", "fix": "",
                     "detail": "no GPUs granted here and no nvidia-smi on PATH"}


def test_granted_gpus_without_nvidia_smi_warn_and_name_apptainers_flag(node):
    _, check, report = health_check(node, {})
    assert check["status"] == "WARN"
    assert check["detail"] == ("SLURM_GPUS_ON_NODE=4 granted 4 GPU(s) but nvidia-smi is not on PATH: "
                               "their health was not read")
    assert "apptainer run --nv" in check["fix"] and report["ok"]


def test_nvidia_smi_failing_on_a_node_with_granted_gpus_fails_it(node):
    # NHC dies when nvidia-smi returns an error code; the driver's own words are the detail.
    answer = {NVIDIA_SMI: (15, "", "Unable to determine the device handle for GPU0000:19:01.0: GPU is lost.  "
                                   "Reboot the system to recover this GPU\n")}
    code, check, _ = health_check(node, answer)
    assert code == 1 and check["status"] == "FAIL"
    assert check["detail"] == ("4 GPU(s) granted (SLURM_GPUS_ON_NODE=4) but `nvidia-smi -q -x` exit 15: Unable to "
                               "determine the device handle for GPU0000:19:01.0: GPU is lost.  Reboot the system to "
                               "recover this GPU")


def test_nvidia_smi_finding_no_gpu_where_none_was_granted_is_skipped(node):
    _, check, _ = health_check(node, {NVIDIA_SMI: (6, "No devices were found\n", "")}, env={})
    assert check["status"] == "SKIP"
    assert check["detail"] == "no GPUs granted here; `nvidia-smi -q -x` exit 6: No devices were found"


def test_a_hanging_nvidia_smi_is_a_failure_with_its_timeout(node):
    _, check, _ = health_check(node, {NVIDIA_SMI: (124, "", "no answer within 120 s")})
    assert check["status"] == "FAIL" and check["detail"].endswith("exit 124: no answer within 120 s")


@pytest.mark.parametrize("text, why", [
    # A truncated document (nvidia-smi killed mid-write); expat names where it stopped.
    ("<nvidia_smi_log><gpu id='0'>", "not XML (no element found: line 1, column "),
    ("<?xml version='1.0'?><smi/>", "the root element is <smi>, not <nvidia_smi_log>"),
])
def test_output_that_is_not_the_documented_xml_warns_in_one_line(node, text, why):
    _, check, _ = health_check(node, {NVIDIA_SMI: (0, text, "")})
    assert check["status"] == "WARN"
    assert check["detail"].startswith(f"cannot read the output of `nvidia-smi -q -x`: {why}")
    assert "\n" not in check["detail"]


# -- AMD: amd-smi's JSON, each command's file ----------------------------------------------------

def lumi(node, case, answers=None):
    lumi_node(node)
    fake = FakeProbes(torch=ROCM_TORCH, health={**amd(case), **(answers or {})})
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB, fake)
    return code, checks["gpu health"], fake


def test_a_healthy_lumi_node_reads_every_amd_smi_command(node):
    code, check, fake = lumi(node, "healthy")
    assert code == 0 and check["status"] == "OK"
    assert check["detail"] == ("8 GPU(s) listed by amd-smi, 8 granted; none has uncorrectable ECC errors, pending or "
                               "failed memory repair, clock slowdown, temperature over its slowdown limit")
    assert fake.health_asked == list(AMD_SMI)


@pytest.mark.parametrize("case, detail", [
    ("ecc", "uncorrectable ECC errors: GPU 5 ecc/total_uncorrectable_count=3"),
    ("pending-pages", "pending or failed memory repair: GPU 2 pending=1 page"),
    ("unreservable", "pending or failed memory repair: GPU 6 un_res=2 page(s)"),
    # PROCHOT and the thermal limits fail; package power tracking (the power cap, GPU 0 here) does not.
    ("throttle", "clock slowdown: GPU 3 throttle/hbm_thermal_violation_status=ACTIVE"),
    ("hot", "temperature over its slowdown limit: GPU 1 temperature/hotspot=106 >= its slowdown "
            "limit/slowdown_hotspot_temperature=105"),
    ("fewer", "fewer GPUs than granted: amd-smi lists 7 GPU(s), SLURM_GPUS_ON_NODE=8 granted 8"),
])
def test_each_documented_amd_failure_fails_the_node(node, case, detail):
    code, check, _ = lumi(node, case)
    assert code == 1 and check["status"] == "FAIL" and check["detail"] == detail


THROTTLE = ("amd-smi", "metric", "--throttle", "--json")
ROCM_6_0_NO_THROTTLE = {THROTTLE: (2, "", "amd-smi: error: unrecognized arguments: --throttle\n")}


def test_rocm_6_0s_amd_smi_is_read_and_its_missing_throttle_option_is_a_note(node):
    # ROCm 6.0: bare numbers, total_uncorrectable, and no `metric --throttle` (argparse exits 2).
    code, check, _ = lumi(node, "rocm-6.0", ROCM_6_0_NO_THROTTLE)
    assert code == 0 and check["status"] == "OK"
    assert check["detail"] == ("8 GPU(s) listed by amd-smi, 8 granted; none has uncorrectable ECC errors, pending or "
                               "failed memory repair, temperature over its slowdown limit; not reported by these GPUs: "
                               "clock slowdown; not read: `amd-smi metric --throttle --json` (exit 2)")


def test_rocm_6_0s_bare_numbers_still_find_an_uncorrectable_error(node):
    metric = json.loads((DATA / "amd" / "rocm-6.0" / "metric.json").read_text())
    metric[4]["ecc"]["total_uncorrectable"] = 1
    metric_argv = next(argv for argv, name in AMD_SMI.items() if name == "metric")
    _, check, _ = lumi(node, "rocm-6.0", {**ROCM_6_0_NO_THROTTLE, metric_argv: (0, json.dumps(metric), "")})
    assert check["detail"] == "uncorrectable ECC errors: GPU 4 ecc/total_uncorrectable=1"


# -- the readers' rules, as tables ----------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("27 C", 27.0), ("-2 C", -2.0), (0, 0.0), ("0", 0.0), ({"value": 105, "unit": "C"}, 105.0),
    ("N/A", None), (None, None), ("Requested functionality has been deprecated", None), (True, None),
    ({"value": "N/A"}, None), ("Active", None),
])
def test_numbers_are_read_with_or_without_their_unit(value, expected):
    assert number(value) == expected


@pytest.mark.parametrize("value, fails_when, expected", [
    ("2", "above_zero", True), ("0", "above_zero", False), ("N/A", "above_zero", None),
    ("Yes", "yes", True), ("No", "yes", False), ("N/A", "yes", None),
    ("Active", "active", True), ("Not Active", "active", False), ("ACTIVE", "active", True),
    ("NOT ACTIVE", "active", False), ("Unknown", "active", None),
    ([{"page_address": "0x1"}], "entries", True), ({"page_address": "0x1"}, "entries", True),
    ("No bad pages found.", "entries", False), ("N/A", "entries", None), (None, "entries", None),
])
def test_what_each_kind_of_field_fails_on(value, fails_when, expected):
    assert fails(value, fails_when) is expected


def test_a_whole_element_reported_as_n_a_has_no_fields_under_it():
    assert value_at({"remapped_rows": "N/A"}, "remapped_rows/remapped_row_pending") is None
    assert value_at({"a": {"b": "Yes"}}, "a/b") == "Yes"


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_every_health_rule_says_which_public_check_it_follows(vendor):
    health = load_accelerator(vendor, {}).health
    for rule in health.rules:
        assert "DCGM" in rule.source or "NHC" in rule.source, (vendor, rule.name)
    assert re.search(r"not (a number|numbers) of ours", health.temperature_source)


# -- the fake nvidia-smi the e2e tests put on one node's PATH --------------------------------------

@pytest.fixture
def fake_nvidia_smi_on_path(monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CASES", "node2:ecc")


@pytest.mark.parametrize("node_name, status", [("node1", "OK"), ("node2", "FAIL")])
def test_the_fake_nvidia_smi_fails_only_the_node_it_names(node, fake_nvidia_smi_on_path, monkeypatch,
                                                           node_name, status):
    # The real probes: shutil.which finds the fake on PATH, a real subprocess runs it.
    monkeypatch.setenv("SLURMD_NODENAME", node_name)
    probes = dataclasses.replace(FakeProbes().probes(), which=shutil.which, read_command=real_read_command)
    out = io.StringIO()
    run(["--root", str(node.root), "--json", "--offline"], {}, out, probes)
    check = {c["name"]: c for c in json.loads(out.getvalue())["checks"]}["gpu health"]
    assert check["status"] == status
    if status == "FAIL":
        assert check["detail"].startswith("uncorrectable ECC errors: GPU 2 (00000029:01:00.0)")


def test_the_fake_nvidia_smi_refuses_what_it_does_not_fake(fake_nvidia_smi_on_path):
    code, _, stderr = real_read_command(["nvidia-smi", "--query-gpu=name", "--format=csv"])
    assert code == 2 and stderr.strip() == "fake nvidia-smi: only '-q -x' is faked, not '--query-gpu=name --format=csv'"


# -- a failed health check takes the bad-node path: the quarantine record --------------------------

def test_a_gpu_health_failure_puts_the_node_in_quarantine(node, tmp_path, capsys):
    _, _, report = health_check(node, nvidia("ecc"), env={**JOB, "SLURMD_NODENAME": "olivia-gh002"},
                                argv=("--offline", "--site", "olivia"))
    preflight = tmp_path / "preflight" / "771234"
    preflight.mkdir(parents=True)
    (preflight / "doctor-olivia-gh002.json").write_text(json.dumps(report))
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    # One report of a 2-node job (JOB: olivia-gh[001-002]); the other node passed.
    code = quarantine.main(["add", "--by", "doctor", "--job", "771234", "--nodes", "2", str(run_dir),
                            str(preflight / "doctor-olivia-gh002.json")])

    assert code == EXIT_BAD_NODE
    (entry,) = quarantine.read_record(str(run_dir))
    assert entry.node == "olivia-gh002" and entry.by == "doctor"
    assert ("gpu health: uncorrectable ECC errors: GPU 2 (00000029:01:00.0) "
            "ecc_errors/volatile/dram_uncorrectable=2") in entry.why
    assert "excluded olivia-gh002 (named by the doctor in job 771234, restart 0): " in capsys.readouterr().out


def test_a_gpu_health_warning_alone_excludes_nobody(node, tmp_path):
    _, check, report = health_check(node, {})  # granted GPUs, no nvidia-smi: WARN
    assert check["status"] == "WARN" and report["ok"]
    path = tmp_path / "doctor-node1.json"
    path.write_text(json.dumps(report))
    assert quarantine.main(["add", "--by", "doctor", str(tmp_path), str(path)]) == 0
    assert quarantine.read_record(str(tmp_path)) == ()
