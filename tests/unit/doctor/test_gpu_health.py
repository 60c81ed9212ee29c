"""The doctor's GPU health check against the vendors' own output formats. NVIDIA: a real `nvidia-smi -q -x`
of an H200 on driver 580 (data/gpu-health/nvidia/real/), changed field by field per case
(data/gpu-health/nvidia/cases.py). AMD: amd-smi --json as its CLI prints it (ROCm/amdsmi amdsmi_cli),
one document per failure in data/gpu-health/amd/. The rules and their sources are in
containers/sites/accelerators/<vendor>.json."""

from __future__ import annotations

import dataclasses
import importlib.util
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
from ddp_launch.doctor.gpu_health import GpuRecord, fails, number, pci_bus_id, value_at
from ddp_launch.doctor.probes import real_read_command

DATA = Path(__file__).parent / "data" / "gpu-health"
FAKE_BIN = DATA / "bin"
_SPEC = importlib.util.spec_from_file_location("nvidia_smi_cases", DATA / "nvidia" / "cases.py")
cases = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cases)

NVIDIA_SMI = ("nvidia-smi", "-q", "-x")
AMD_SMI = {  # the commands of amd.json's health section, and the file each case keeps its answer in
    ("amd-smi", "metric", "--ecc", "--temperature", "--json"): "metric",
    ("amd-smi", "bad-pages", "--pending", "--un-res", "--json"): "bad-pages",
    ("amd-smi", "static", "--limit", "--json"): "static-limit",
    ("amd-smi", "metric", "--throttle", "--json"): "throttle",
}
GRANTED_4 = {"SLURM_GPUS_ON_NODE": "4"}
SLOWDOWN = "clocks_event_reasons/clocks_event_reason_"
RULES_READ = ("uncorrectable ECC errors, pending or failed memory repair, pending compute (TPC) repair, clock slowdown, "
              "temperature over its slowdown limit")


def answer(text, code=0, stderr=""):
    return (code, text, stderr)


def nvidia(case: str) -> dict:
    return {NVIDIA_SMI: answer(cases.document(case))}


def readings(*case_names: str) -> dict:
    """nvidia-smi answering each reading with the next case (the last one repeats)."""
    return {NVIDIA_SMI: [answer(cases.document(name)) for name in case_names]}


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
    return code, checks["gpu health"], report, fake


# -- the real output -----------------------------------------------------------------------------

def test_the_real_h200_output_passes_and_every_rule_reads_a_field_of_it(node):
    real = Path(cases.REAL).read_text()
    code, check, report, fake = health_check(node, {NVIDIA_SMI: answer(real)}, env={"SLURM_GPUS_ON_NODE": "1"})
    assert code == 0 and report["ok"]
    assert check == {"name": "gpu health", "status": "OK", "fix": "",
                     "detail": f"1 GPU(s) listed by nvidia-smi, 1 granted; judged all: GPU 0; none has {RULES_READ}"}
    assert fake.slept == [] and fake.health_asked == [NVIDIA_SMI]  # nothing seen: one reading, no wait


def test_a_node_of_four_is_the_real_gpu_four_times_with_its_own_bus_id_minor_number_and_uuid():
    from xml.etree import ElementTree

    real = ElementTree.fromstring(Path(cases.REAL).read_text()).find("gpu")
    node = ElementTree.fromstring(cases.document("healthy")).findall("gpu")
    assert [g.get("id") for g in node] == ["00000000:00:06.0", "00000000:00:07.0", "00000000:00:08.0", "00000000:00:09.0"]
    assert [g.findtext("minor_number") for g in node] == ["0", "1", "2", "3"]
    assert node[0].get("id") == real.get("id") and node[0].findtext("uuid") == real.findtext("uuid")
    # Nothing else differs from the real GPU.
    tags = lambda gpu: [(e.tag, (e.text or "").strip()) for e in gpu.iter()  # noqa: E731
                        if e.tag not in ("pci_bus_id", "pci_device", "minor_number", "uuid")]
    assert all(tags(gpu) == tags(real) for gpu in node)


def test_a_case_that_names_a_field_the_real_output_lacks_is_refused():
    with pytest.raises(KeyError, match="has no <ecc_errors/volatile/dram_uncorrected>"):
        cases.node_document(1, {0: {"ecc_errors/volatile/dram_uncorrected": "1"}})


# -- faults: one reading fails the node -----------------------------------------------------------

@pytest.mark.parametrize("case, detail", [
    # DCGM_FR_VOLATILE_DBE_DETECTED: any volatile uncorrectable ECC error fails the GPU.
    ("ecc", "uncorrectable ECC errors: GPU 2 (00000000:00:08.0) ecc_errors/volatile/dram_uncorrectable=2"),
    # DCGM diagnostics (Software.cpp checkRowRemapping) and NHC check_gpu_ecc: pending or failed remaps.
    ("remap-pending", "pending or failed memory repair: GPU 1 (00000000:00:07.0) remapped_rows/remapped_row_pending=Yes"),
    ("remap-failure", "pending or failed memory repair: GPU 3 (00000000:00:09.0) remapped_rows/remapped_row_failure=Yes"),
    # Driver 580's repair flags (NVML nvmlDeviceGetRepairStatus, nvmlDeviceGetUnrepairableMemoryFlag_v1).
    ("channel-repair-pending", "pending or failed memory repair: GPU 1 (00000000:00:07.0) "
                               "ecc_errors/channel_repair_pending=Yes"),
    ("tpc-repair-pending", "pending compute (TPC) repair: GPU 2 (00000000:00:08.0) ecc_errors/tpc_repair_pending=Yes"),
    ("unrepairable-memory", "pending or failed memory repair: GPU 3 (00000000:00:09.0) ecc_errors/unrepairable_memory=Yes"),
    # Pre-Ampere GPUs retire pages; the element was pending_blacklist, then pending_retirement: both are read.
    ("retired-pending", "pending or failed memory repair: GPU 2 (00000000:00:08.0) retired_pages/pending_blacklist=Yes "
                        "retired_pages/pending_retirement=Yes"),
    # ... and fewer GPUs than the scheduler granted (NHC check_gpu_count).
    ("fewer", "fewer GPUs than granted: nvidia-smi lists 3 GPU(s), SLURM_GPUS_ON_NODE=4 granted 4"),
])
def test_a_fault_fails_the_node_at_once_naming_the_gpu_and_the_element(node, case, detail):
    code, check, report, fake = health_check(node, nvidia(case))
    assert code == 1 and not report["ok"]
    assert check["status"] == "FAIL" and check["detail"] == detail
    assert fake.slept == [] and fake.health_asked == [NVIDIA_SMI]


@pytest.mark.parametrize("field", ["channel_repair_pending", "tpc_repair_pending", "unrepairable_memory"])
def test_each_driver_580_repair_flag_is_judged_by_a_rule_that_cites_nvml(field):
    # The flags nvidia-smi 580 prints under <ecc_errors> (the real output has all three, "No").
    assert f"<{field}>No</{field}>" in Path(cases.REAL).read_text()
    (rule,) = [r for r in load_accelerator("nvidia", {}).health.rules
               if any(s.path == f"ecc_errors/{field}" for s in r.signals)]
    assert rule.kind == "fault" and "https://docs.nvidia.com/deploy/nvml-api/" in rule.source
    assert "nvmlDeviceGet" in rule.source and ("DCGM" in rule.source)


def test_the_failure_says_what_the_user_can_do_and_keeps_the_tools_output(node):
    env = {**GRANTED_4, "SLURMD_NODENAME": "gpu-7"}
    _, check, _, _ = health_check(node, nvidia("ecc"), env=env)
    fix = check["fix"]
    assert "--exclude=gpu-7" in fix and "`nvidia-smi -q -x`" in fix and "support" in fix
    assert "runs/<job>/preflight/<job>/doctor-gpu-7.json" in fix
    assert "drain" not in fix  # only an admin can drain a node
    # The evidence is the sick GPU's own element of the tool's output, for the site's support.
    assert check["evidence"].startswith('<gpu id="00000000:00:08.0">')
    assert "<dram_uncorrectable>2</dram_uncorrectable>" in check["evidence"]
    assert check["evidence"].count("<gpu ") == 1


def test_a_healthy_node_has_no_evidence_in_its_report(node):
    _, check, _, _ = health_check(node, nvidia("healthy"))
    assert "evidence" not in check


# -- states: read again, fail only what holds --------------------------------------------------------

@pytest.mark.parametrize("case, detail", [
    # NVML clocks event reasons: HW slowdown and the thermal slowdowns.
    ("hw-slowdown", "clock slowdown: GPU 0 (00000000:00:06.0) clocks_event_reasons/clocks_event_reason_hw_slowdown=Active"),
    ("thermal-slowdown", "clock slowdown: GPU 0 (00000000:00:06.0) "
                         "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown=Active "
                         "clocks_event_reasons/clocks_event_reason_sw_thermal_slowdown=Active"),
    # Drivers before 535 name the same reasons clocks_throttle_reason_*.
    ("old-throttle", "clock slowdown: GPU 0 (00000000:00:06.0) "
                     "clocks_throttle_reasons/clocks_throttle_reason_hw_slowdown=Active"),
    # The GPU's own slowdown temperature, absolute (an A100's driver prints gpu_temp_slow_threshold) ...
    ("hot", "temperature over its slowdown limit: GPU 3 (00000000:00:09.0) temperature/gpu_temp=91 >= its slowdown "
            "temperature/gpu_temp_slow_threshold=89"),
    # ... and Hopper's T.Limit headroom at or below its slowdown margin (-2 C in the real output).
    ("hot-tlimit", "temperature over its slowdown limit: GPU 1 (00000000:00:07.0) temperature/gpu_temp_tlimit=-3 <= its "
                   "slowdown temperature/gpu_temp_slow_tlimit_threshold=-2"),
])
def test_a_state_that_holds_in_a_second_reading_fails_the_node(node, case, detail):
    code, check, _, fake = health_check(node, nvidia(case))
    assert code == 1 and check["status"] == "FAIL"
    assert check["detail"] == f"{detail} (held in two readings 5 s apart)"
    assert fake.slept == [5] and fake.health_asked == [NVIDIA_SMI, NVIDIA_SMI]
    assert "cooling or power" in check["fix"]


def test_a_slowdown_that_passes_within_seconds_is_no_failure_and_the_ok_line_says_so(node):
    code, check, report, fake = health_check(node, readings("thermal-slowdown", "healthy"))
    assert code == 0 and report["ok"] and check["status"] == "OK"
    assert ("; clock slowdown: GPU 0 (00000000:00:06.0) clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown="
            "Active clocks_event_reasons/clocks_event_reason_sw_thermal_slowdown=Active in a first reading passed within "
            "5 s (a momentary state, not a fault)") in check["detail"]
    assert fake.slept == [5]


def test_a_state_on_another_gpu_in_the_second_reading_is_not_the_same_condition(node):
    # The first reading's GPU 0 cooled down; GPU 1 slowing down now was not seen twice.
    hot_gpu1 = answer(cases.node_document(4, {1: {SLOWDOWN + "hw_slowdown": "Active"}}))
    code, check, _, _ = health_check(node, {NVIDIA_SMI: [answer(cases.document("hw-slowdown")), hot_gpu1]})
    assert code == 0 and check["status"] == "OK"


def test_a_fault_beside_a_state_fails_at_once_without_a_second_reading(node):
    both = answer(cases.node_document(4, {0: {SLOWDOWN + "hw_slowdown": "Active"},
                                          2: {"ecc_errors/volatile/dram_uncorrectable": "1"}}))
    code, check, _, fake = health_check(node, {NVIDIA_SMI: both})
    assert code == 1 and fake.slept == []
    assert check["detail"].startswith("uncorrectable ECC errors: GPU 2 (00000000:00:08.0)")
    assert "clock slowdown: GPU 0" in check["detail"]


def test_a_second_reading_that_cannot_be_read_leaves_the_first_readings_state_failing(node):
    code, check, _, _ = health_check(node, {NVIDIA_SMI: [answer(cases.document("hw-slowdown")), answer("<smi/>")]})
    assert code == 1
    assert check["detail"] == ("clock slowdown: GPU 0 (00000000:00:06.0) clocks_event_reasons/clocks_event_reason_hw_"
                               "slowdown=Active (in the first reading; the second: cannot read the output of "
                               "`nvidia-smi -q -x`: the root element is <smi>, not <nvidia_smi_log>)")


def test_a_fault_that_shows_in_the_second_reading_fails_the_node(node):
    code, check, _, _ = health_check(node, readings("hw-slowdown", "ecc"))
    assert code == 1
    assert check["detail"] == "uncorrectable ECC errors: GPU 2 (00000000:00:08.0) ecc_errors/volatile/dram_uncorrectable=2"


def test_idle_and_power_capped_gpus_are_not_slowed_down(node):
    # SW power cap is the limit the site set, GPU idle is no work (Active in the real output): NHC accepts both.
    code, check, _, fake = health_check(node, nvidia("power-capped"))
    assert code == 0 and check["status"] == "OK" and fake.slept == []


# -- whose GPUs: the grant's, not the node's -------------------------------------------------------------

ONE_GPU_ON_A_SHARED_NODE = {"SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}


def test_another_jobs_sick_hot_gpu_on_a_shared_node_is_none_of_this_jobs_business(node):
    # A 1-GPU job on a node whose GPU 3, another job's, has an ECC error and slows down hot.
    code, check, report, fake = health_check(node, nvidia("other-job-gpu-sick"), env=ONE_GPU_ON_A_SHARED_NODE)
    assert code == 0 and report["ok"]
    assert check["detail"] == ("4 GPU(s) listed by nvidia-smi, 1 granted; judged GPU 0, the one(s) SLURM_JOB_GPUS=0 "
                               f"grants (the others are other jobs'); none has {RULES_READ}")
    assert fake.slept == []


def test_the_jobs_own_gpu_on_a_shared_node_is_judged(node):
    env = {**ONE_GPU_ON_A_SHARED_NODE, "SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "3"}
    code, check, _, _ = health_check(node, nvidia("other-job-gpu-sick"), env=env)
    assert code == 1
    assert check["detail"].startswith("uncorrectable ECC errors: GPU 3 (00000000:00:09.0) "
                                      "ecc_errors/volatile/dram_uncorrectable=4")


def test_the_steps_gpu_ids_come_first_and_a_uuid_names_a_gpu_too(node):
    # srun(1): SLURM_STEP_GPUS, the step's own GPUs, by the node's IDs; CUDA_VISIBLE_DEVICES by UUID.
    by_step = {"SLURM_GPUS_ON_NODE": "1", "SLURM_STEP_GPUS": "2", "SLURM_JOB_GPUS": "0,1,2"}
    _, check, _, _ = health_check(node, nvidia("ecc"), env=by_step)
    assert check["status"] == "FAIL" and check["detail"].startswith("uncorrectable ECC errors: GPU 2 ")
    by_uuid = {"RUNAI_NUM_OF_GPUS": "1", "CUDA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000001"}
    _, check, _, _ = health_check(node, nvidia("ecc"), env=by_uuid)
    assert check["status"] == "OK" and "judged GPU 1, the one(s) CUDA_VISIBLE_DEVICES=GPU-00000000" in check["detail"]


def test_where_a_device_cgroup_shows_only_the_granted_gpu_it_is_judged_whatever_its_global_id(node):
    # SLURM's cgroup (ConstrainDevices) lets nvidia-smi see the granted GPU only, as GPU 0, while
    # SLURM_JOB_GPUS keeps the node's ID (srun(1): "not relative to any device cgroup"). Nothing
    # changes there: the one GPU listed is judged, and a sick one fails the node as before.
    env = {"SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "0"}
    sick = answer(cases.node_document(1, {0: {"ecc_errors/volatile/dram_uncorrectable": "1"}}))
    code, check, _, _ = health_check(node, {NVIDIA_SMI: sick}, env=env)
    assert code == 1 and check["detail"] == ("uncorrectable ECC errors: GPU 0 (00000000:00:06.0) "
                                             "ecc_errors/volatile/dram_uncorrectable=1")
    code, check, _, _ = health_check(node, {NVIDIA_SMI: answer(cases.node_document(1))}, env=env)
    assert code == 0 and check["detail"].startswith("1 GPU(s) listed by nvidia-smi, 1 granted; judged all: GPU 0; ")


def test_a_name_no_listed_gpu_answers_to_judges_them_all_and_says_why(node):
    env = {"SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_GPUS": "7"}
    code, check, _, _ = health_check(node, nvidia("ecc"), env=env)
    assert code == 1 and check["detail"].startswith("uncorrectable ECC errors: GPU 2 ")
    _, check, _, _ = health_check(node, nvidia("healthy"), env=env)
    assert ("judged all: GPU 0, 1, 2, 3 (SLURM_JOB_GPUS names 7, which no GPU nvidia-smi lists answers to by index, "
            "UUID or PCI bus ID)") in check["detail"]


@pytest.mark.parametrize("name, named", [
    ("2", True), ("3", False),
    ("GPU-00000000-0000-0000-0000-000000000002", True), ("gpu-00000000-0000-0000-0000-000000000002", True),
    ("GPU-00000000-0000", True),  # CUDA takes a unique prefix of the UUID
    ("GPU-00000000-0000-0000-0000-000000000003", False),
    ("MIG-GPU-00000000-0000-0000-0000-000000000002/1/0", True),  # the MIG device of this GPU (CUDA before R470)
    ("MIG-4f2d7e4b-9c1a-5b3e-8d6f-0a1b2c3d4e5f", False),          # a MIG UUID names no GPU in nvidia-smi -q -x
    ("0000:00:08.0", True), ("00000000:00:08.0", True), ("8:0.0", False), ("0000:00:09.0", False),
])
def test_a_gpu_answers_to_its_index_uuid_mig_parent_and_pci_bus_id(name, named):
    gpu = GpuRecord("GPU 2", {}, index=2, ids=("gpu-00000000-0000-0000-0000-000000000002", pci_bus_id("00000000:00:08.0")))
    assert gpu.is_named_by(name) is named


# -- what the GPUs do not say ------------------------------------------------------------------------

def test_blackwells_split_sram_counters_are_read_too(node):
    # nvsmi_device_v13 splits volatile SRAM uncorrectable into _parity and _secded, as the real H200 output does.
    text = cases.node_document(4, {0: {"ecc_errors/volatile/sram_uncorrectable_secded": "1"}})
    _, check, _, _ = health_check(node, {NVIDIA_SMI: answer(text)})
    assert check["detail"] == ("uncorrectable ECC errors: GPU 0 (00000000:00:06.0) "
                               "ecc_errors/volatile/sram_uncorrectable_secded=1")


def test_aggregate_dram_errors_alone_do_not_fail(node):
    # Lifetime DRAM counts were handled by remapping; DCGM fails only the volatile ones.
    text = cases.node_document(4, {1: {"ecc_errors/aggregate/dram_uncorrectable": "5"}})
    _, check, _, _ = health_check(node, {NVIDIA_SMI: answer(text)})
    assert check["status"] == "OK"


def test_a_mig_gpu_counts_as_its_mig_devices_and_its_n_a_rows_are_no_failure(node):
    # With MIG on, SLURM grants MIG devices, and NVML reports remapped rows for the whole GPU as N/A.
    code, check, _, _ = health_check(node, nvidia("mig"))
    assert code == 0 and check["status"] == "OK"
    assert check["detail"].startswith("1 GPU(s) (4 devices to grant) listed by nvidia-smi, 4 granted; judged all: GPU 0")


def test_fields_a_gpu_does_not_report_are_named_not_failed(node):
    # Every health field N/A (a board without ECC or clock reasons, say): no failure, and the detail
    # says what was not read (nvidia-smi(1): unsupported data is "N/A").
    fields = [path for rule in load_accelerator("nvidia", {}).health.rules for path in (s.path for s in rule.signals)]
    fields += ["temperature/gpu_temp_tlimit"]

    def unreported(gpu):
        for path in fields:
            if gpu.find(path) is not None:
                cases.set_field(gpu, path, "N/A")

    text = cases.node_document(3, {i: unreported for i in range(3)})
    _, check, _, _ = health_check(node, {NVIDIA_SMI: answer(text)}, env={})
    assert check["status"] == "OK"
    assert check["detail"] == (f"3 GPU(s) listed by nvidia-smi; judged all: GPU 0, 1, 2; not reported by these GPUs: "
                               f"{RULES_READ}")


def test_fewer_gpus_without_a_grant_is_no_failure(node):
    # Nothing to compare with: a node outside a job, or a pod the operator gave no count.
    _, check, _, _ = health_check(node, nvidia("fewer"), env={})
    assert check["status"] == "OK" and check["detail"].startswith("3 GPU(s) listed by nvidia-smi; judged all")


def test_the_grant_comes_from_the_launchers_own_variables(node):
    # ddp_launch.gpus: a step's CUDA_VISIBLE_DEVICES (SLURM's gres) counts when SLURM_GPUS_ON_NODE is unset.
    _, check, _, _ = health_check(node, nvidia("fewer"), env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert check["detail"] == ("fewer GPUs than granted: nvidia-smi lists 3 GPU(s), "
                               "CUDA_VISIBLE_DEVICES=0,1,2,3 granted 4")


# -- the tool missing or failing: a result, not a traceback -------------------------------------

def test_a_cpu_node_without_gpus_or_nvidia_smi_is_skipped(node):
    # The e2e cluster's jobs: sbatch --gpus-per-node=0, CPU workers, no nvidia-smi in the image.
    env = {**JOB, "SLURM_GPUS_ON_NODE": "0", "DDP_LAUNCH_CPU_WORKERS": "2"}
    code, check, _, _ = health_check(node, {}, env=env, argv=("--offline", "--site", "generic"))
    assert check == {"name": "gpu health", "status": "SKIP", "fix": "",
                     "detail": "no GPUs granted here and no nvidia-smi on PATH"}


def test_granted_gpus_without_nvidia_smi_warn_and_name_apptainers_flag(node):
    _, check, report, _ = health_check(node, {})
    assert check["status"] == "WARN"
    assert check["detail"] == ("SLURM_GPUS_ON_NODE=4 granted 4 GPU(s) but nvidia-smi is not on PATH: "
                               "their health was not read")
    # Apptainer's etc/nvliblist.conf lists nvidia-smi among the binaries --nv binds.
    assert "`apptainer run --nv`, which binds the host's nvidia-smi" in check["fix"] and report["ok"]


def test_nvidia_smi_failing_on_a_node_with_granted_gpus_fails_it(node):
    # NHC dies when nvidia-smi returns an error code; the driver's own words are the detail.
    lost = ("Unable to determine the device handle for GPU0000:19:01.0: GPU is lost.  "
            "Reboot the system to recover this GPU\n")
    code, check, _, _ = health_check(node, {NVIDIA_SMI: answer("", 15, lost)})
    assert code == 1 and check["status"] == "FAIL"
    assert check["detail"] == ("4 GPU(s) granted (SLURM_GPUS_ON_NODE=4) but `nvidia-smi -q -x` exit 15: Unable to "
                               "determine the device handle for GPU0000:19:01.0: GPU is lost.  Reboot the system to "
                               "recover this GPU")
    assert check["evidence"] == lost.strip()


def test_nvidia_smi_finding_no_gpu_where_none_was_granted_is_skipped(node):
    _, check, _, _ = health_check(node, {NVIDIA_SMI: answer("No devices were found\n", 6)}, env={})
    assert check["status"] == "SKIP"
    assert check["detail"] == "no GPUs granted here; `nvidia-smi -q -x` exit 6: No devices were found"


def test_a_hanging_nvidia_smi_is_a_failure_with_its_timeout(node):
    _, check, _, _ = health_check(node, {NVIDIA_SMI: answer("", 124, "no answer within 120 s")})
    assert check["status"] == "FAIL" and check["detail"].endswith("exit 124: no answer within 120 s")


@pytest.mark.parametrize("text, why", [
    # The real document cut off mid-write (nvidia-smi killed); expat names where it stopped.
    (cases.document("healthy").split("<product_name>")[0], "not XML (no element found: line "),
    ("<?xml version='1.0'?><smi/>", "the root element is <smi>, not <nvidia_smi_log>"),
])
def test_output_that_is_not_the_documented_xml_warns_in_one_line(node, text, why):
    _, check, _, _ = health_check(node, {NVIDIA_SMI: answer(text)})
    assert check["status"] == "WARN"
    assert check["detail"].startswith(f"cannot read the output of `nvidia-smi -q -x`: {why}")
    assert "\n" not in check["detail"]


# -- AMD: amd-smi's JSON, each command's file ----------------------------------------------------

def lumi(node, case, answers=None, env=LUMI_JOB):
    lumi_node(node)
    fake = FakeProbes(torch=ROCM_TORCH, health={**amd(case), **(answers or {})})
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], env, fake)
    return code, checks["gpu health"], fake


AMD_RULES_READ = "uncorrectable ECC errors, pending or failed memory repair, clock slowdown, temperature over its slowdown limit"


def test_a_healthy_lumi_node_reads_every_amd_smi_command(node):
    code, check, fake = lumi(node, "healthy")
    assert code == 0 and check["status"] == "OK"
    assert check["detail"] == (f"8 GPU(s) listed by amd-smi, 8 granted; judged all: GPU 0, 1, 2, 3, 4, 5, 6, 7; "
                               f"none has {AMD_RULES_READ}")
    assert fake.health_asked == list(AMD_SMI)


def wrapped(case: str, name: str) -> str:
    """amd-smi's JSON in the releases that report CPUs too: {"cpu_data": [...], "core_data": [...],
    "gpu_data": [...]} (ROCm/amdsmi amdsmi_cli/amdsmi_logger.py, combine_arrays_to_json)."""
    path = DATA / "amd" / case / f"{name}.json"
    gpus = json.loads((path if path.exists() else DATA / "amd" / "healthy" / f"{name}.json").read_text())
    return json.dumps({"cpu_data": [], "core_data": [], "gpu_data": gpus}, indent=4)


@pytest.mark.parametrize("case, status", [("healthy", "OK"), ("ecc", "FAIL"), ("pending-pages", "FAIL")])
def test_amd_smi_output_wrapped_in_gpu_data_is_read_as_the_list(node, case, status):
    answers = {argv: (0, wrapped(case, name), "") for argv, name in AMD_SMI.items()}
    code, check, _ = lumi(node, case, answers)
    assert check["status"] == status
    if status == "OK":
        assert check["detail"] == (f"8 GPU(s) listed by amd-smi, 8 granted; judged all: GPU 0, 1, 2, 3, 4, 5, 6, 7; "
                                   f"none has {AMD_RULES_READ}")


def test_json_that_is_neither_documented_form_warns(node):
    metric = next(argv for argv, name in AMD_SMI.items() if name == "metric")
    _, check, _ = lumi(node, "healthy", {metric: (0, json.dumps({"gpus": []}), "")})
    assert check["status"] == "WARN"
    assert check["detail"] == ('cannot read the output of `amd-smi metric --ecc --temperature --json`: neither a list '
                               'of objects with a "gpu" key nor an object with such a "gpu_data" list')


@pytest.mark.parametrize("case, detail", [
    ("ecc", "uncorrectable ECC errors: GPU 5 ecc/total_uncorrectable_count=3"),
    ("pending-pages", "pending or failed memory repair: GPU 2 pending=1 page"),
    ("unreservable", "pending or failed memory repair: GPU 6 un_res=2 page(s)"),
    ("fewer", "fewer GPUs than granted: amd-smi lists 7 GPU(s), SLURM_GPUS_ON_NODE=8 granted 8"),
])
def test_each_documented_amd_fault_fails_the_node(node, case, detail):
    code, check, fake = lumi(node, case)
    assert code == 1 and check["status"] == "FAIL" and check["detail"] == detail and fake.slept == []


@pytest.mark.parametrize("case, detail", [
    # PROCHOT and the thermal limits fail; package power tracking (the power cap, GPU 0 here) does not.
    ("throttle", "clock slowdown: GPU 3 throttle/hbm_thermal_violation_status=ACTIVE"),
    ("hot", "temperature over its slowdown limit: GPU 1 temperature/hotspot=106 >= its slowdown "
            "limit/slowdown_hotspot_temperature=105"),
])
def test_each_documented_amd_state_fails_the_node_when_it_holds(node, case, detail):
    code, check, fake = lumi(node, case)
    assert code == 1 and check["detail"] == f"{detail} (held in two readings 5 s apart)" and fake.slept == [5]


def test_on_a_shared_lumi_node_only_the_granted_gcds_are_judged(node):
    # LUMI's small-g: two GCDs of eight; GCD 5 (another job's) has an uncorrectable error.
    env = {**LUMI_JOB, "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "2,3", "ROCR_VISIBLE_DEVICES": "0,1"}
    code, check, _ = lumi(node, "ecc", env=env)
    assert code == 0 and "judged GPU 2, 3, the one(s) SLURM_JOB_GPUS=2,3 grants" in check["detail"]
    code, check, _ = lumi(node, "ecc", env={**env, "SLURM_JOB_GPUS": "4,5"})
    assert code == 1 and check["detail"] == "uncorrectable ECC errors: GPU 5 ecc/total_uncorrectable_count=3"


def test_amd_smi_missing_says_what_rocm_binds_and_what_works(node):
    lumi_node(node)
    fake = FakeProbes(torch=ROCM_TORCH, health={})
    _, checks, _ = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB, fake)
    check = checks["gpu health"]
    assert check["status"] == "WARN"
    # Apptainer's and SingularityCE's etc/rocmliblist.conf list rocm-smi and rocminfo, not amd-smi.
    assert check["fix"].startswith("`singularity run --rocm` binds the host's rocm-smi and rocminfo, not amd-smi")
    assert check["fix"].endswith("put it on the container's PATH with SINGULARITYENV_PREPEND_PATH=/opt/rocm/bin")


THROTTLE = ("amd-smi", "metric", "--throttle", "--json")
ROCM_6_0_NO_THROTTLE = {THROTTLE: (2, "", "amd-smi: error: unrecognized arguments: --throttle\n")}


def test_rocm_6_0s_amd_smi_is_read_and_its_missing_throttle_option_is_a_note(node):
    # ROCm 6.0: bare numbers, total_uncorrectable, and no `metric --throttle` (argparse exits 2).
    code, check, _ = lumi(node, "rocm-6.0", ROCM_6_0_NO_THROTTLE)
    assert code == 0 and check["status"] == "OK"
    assert check["detail"] == ("8 GPU(s) listed by amd-smi, 8 granted; judged all: GPU 0, 1, 2, 3, 4, 5, 6, 7; none has "
                               "uncorrectable ECC errors, pending or failed memory repair, temperature over its slowdown "
                               "limit; not reported by these GPUs: clock slowdown; not read: "
                               "`amd-smi metric --throttle --json` (exit 2)")


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


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_clock_slowdowns_are_states_and_memory_errors_faults(vendor):
    kinds = {rule.name: rule.kind for rule in load_accelerator(vendor, {}).health.rules}
    assert kinds.pop("clock slowdown") == "state"
    assert set(kinds.values()) == {"fault"}


# -- the fake nvidia-smi the e2e tests put on a node's PATH --------------------------------------

@pytest.fixture
def fake_nvidia_smi_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CASES", "node2:ecc,node3:thermal-slowdown>healthy")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", str(tmp_path))


def real_doctor(node, env_node, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", env_node)
    probes = dataclasses.replace(FakeProbes().probes(), which=shutil.which, read_command=real_read_command,
                                 sleep=lambda seconds: None)
    out = io.StringIO()
    run(["--root", str(node.root), "--json", "--offline"], {}, out, probes)
    return {c["name"]: c for c in json.loads(out.getvalue())["checks"]}["gpu health"]


@pytest.mark.parametrize("node_name, status, detail", [
    ("node1", "OK", "4 GPU(s) listed by nvidia-smi; judged all: GPU 0, 1, 2, 3; none has"),
    ("node2", "FAIL", "uncorrectable ECC errors: GPU 2 (00000000:00:08.0)"),
    # A sequence: thermal slowdown in the first reading, healthy in the second.
    ("node3", "OK", "4 GPU(s) listed by nvidia-smi; judged all: GPU 0, 1, 2, 3; none has"),
])
def test_the_fake_nvidia_smi_answers_each_node_its_case(node, fake_nvidia_smi_on_path, monkeypatch, node_name, status,
                                                         detail):
    # The real probes: shutil.which finds the fake on PATH, a real subprocess runs it.
    check = real_doctor(node, node_name, monkeypatch)
    assert check["status"] == status and check["detail"].startswith(detail)


def test_the_fake_nvidia_smi_refuses_what_it_does_not_fake(fake_nvidia_smi_on_path, monkeypatch):
    code, _, stderr = real_read_command(["nvidia-smi", "--query-gpu=name", "--format=csv"])
    assert code == 2 and stderr.strip() == "fake nvidia-smi: only '-q -x' is faked, not '--query-gpu=name --format=csv'"
    monkeypatch.setenv("SLURMD_NODENAME", "node4")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CASES", "node4:overheated")
    code, _, stderr = real_read_command(["nvidia-smi", "-q", "-x"])
    assert code == 2 and stderr.startswith("fake nvidia-smi: no case 'overheated' (node node4): one of ")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CASES", "node4:hw-slowdown>healthy")
    monkeypatch.delenv("FAKE_NVIDIA_SMI_STATE")
    code, _, stderr = real_read_command(["nvidia-smi", "-q", "-x"])
    assert code == 2 and "set FAKE_NVIDIA_SMI_STATE" in stderr


# -- a failed health check takes the bad-node path: the quarantine record --------------------------

def test_a_gpu_health_failure_puts_the_node_in_quarantine(node, tmp_path, capsys):
    _, _, report, _ = health_check(node, nvidia("ecc"), env={**JOB, "SLURMD_NODENAME": "olivia-gh002"},
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
    assert ("gpu health: uncorrectable ECC errors: GPU 2 (00000000:00:08.0) "
            "ecc_errors/volatile/dram_uncorrectable=2") in entry.why
    assert "excluded olivia-gh002 (named by the doctor in job 771234, restart 0): " in capsys.readouterr().out


def test_a_gpu_health_warning_alone_excludes_nobody(node, tmp_path):
    _, check, report, _ = health_check(node, {})  # granted GPUs, no nvidia-smi: WARN
    assert check["status"] == "WARN" and report["ok"]
    path = tmp_path / "doctor-node1.json"
    path.write_text(json.dumps(report))
    assert quarantine.main(["add", "--by", "doctor", str(tmp_path), str(path)]) == 0
    assert quarantine.read_record(str(tmp_path)) == ()
