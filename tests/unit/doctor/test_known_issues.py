"""Known-bad host stacks as data (containers/sites/known-issues): each shipped row matches the stack its
source describes and not the fixed one; the doctor matches them against what the node loads (real ELF
libraries built with cc where the version is read from the file) and says one line per match, FAIL for
a hang, a crash or corrupt data and WARN for a slowdown; a user's row is one entry in a file of their own;
the preflight's verdict stops a job in one line on a FAIL and prints the WARNs."""
from __future__ import annotations

import json

import pytest
from fakes.elf_tree import build_library
from test_doctor import JOB, FakeProbes, doctor, olivia_node

from ddp_contract import EXIT_USAGE, known_issues
from ddp_contract import quarantine as q
from ddp_contract.errors import LaunchError
from ddp_launch.doctor.stack import plugin_version

SHIPPED = {row.id: row for row in known_issues.load_rows({})}
TORCH_WITHOUT_NCCL = {"version": "2.7.0a0+nv25.06", "cuda": "12.9", "cuda_device_count": 4}  # asks the bound one
LAIF_ROCM7 = "/appl/local/laifs/containers/lumi-multitorch-u24r70f21m50t210/lumi-multitorch-torch-u24r70f21m50t210-20260415_130625.sif"


def stack(versions=None, settings=None):
    return known_issues.Stack(versions or {}, {}, settings or {})


# Each shipped row: a stack its source reports as bad, and the nearest one it says is fine.
SHIPPED_CASES = {
    "laifs-28-gdr-level": (stack({"base_image": LAIF_ROCM7}, {"NCCL_NET_GDR_LEVEL": "PHB"}),
                           stack({"base_image": LAIF_ROCM7})),
    "laifs-44-second-group": (
        stack({"base_image": "lumiaifactory/lumi-multitorch:full-u24r70f21m50t210-20260807_115122"}),
        stack({"base_image": LAIF_ROCM7})),
    "laifs-20-rccl-ddp": (stack({"base_image": "lumi-multitorch-torch-u24r64f21m43t29-20260319_153422.sif"}),
                          stack({"base_image": "lumi-multitorch-torch-u24r64f21m43t29-20260319_153422.sif"},
                                {"CUDA_LAUNCH_BLOCKING": "1"})),
    "nccl-2353-arm-cas": (stack({"nccl": "2.29.2", "machine": "aarch64"}),
                          stack({"nccl": "2.29.3", "machine": "aarch64"})),
    "nccl-2167-nvls": (stack({"nccl": "2.30.4", "gpu": "gb10"}), stack({"nccl": "2.30.3", "gpu": "gb10"})),
    "aws-ofi-nccl-graph-capture": (stack({"aws-ofi-nccl": "1.16.3", "accelerator": "nvidia"}),
                                   stack({"aws-ofi-nccl": "1.21.0", "accelerator": "nvidia"})),
    "nccl-226-gdr-c2c": (stack({"nccl": "2.26.6", "gpu": "gh200", "machine": "aarch64"}),
                         stack({"nccl": "2.26.6", "gpu": "gh200", "machine": "aarch64"}, {"NCCL_NET_GDR_C2C": "1"})),
    "libfabric-11900-lnx": (stack({"libfabric": "2.4"}, {"FI_PROVIDER": "lnx"}),
                            stack({"libfabric": "2.4"}, {"FI_PROVIDER": "cxi"})),
}


def test_every_shipped_row_has_a_case_and_a_public_source():
    assert sorted(SHIPPED) == sorted(SHIPPED_CASES)
    for row in SHIPPED.values():
        assert any(mark in row.source for mark in ("#", "release", "env.rst")), row.id


@pytest.mark.parametrize("row_id", sorted(SHIPPED_CASES))
def test_a_shipped_row_matches_what_its_source_reports_and_not_the_fixed_stack(row_id):
    bad, fine = SHIPPED_CASES[row_id]
    assert known_issues.match(SHIPPED[row_id], bad) is not None
    assert known_issues.match(SHIPPED[row_id], fine) is None
    # A component the node could not read matches nothing: a guess would stop a healthy job.
    unknown = known_issues.Stack({name: None for name in bad.versions}, {}, bad.settings)
    assert known_issues.match(SHIPPED[row_id], unknown) is None


def test_hangs_crashes_and_corruption_fail_a_slowdown_or_a_workload_condition_warns():
    assert SHIPPED["laifs-28-gdr-level"].verdict == "FAIL"
    assert SHIPPED["nccl-226-gdr-c2c"].verdict == "WARN"           # slow
    assert SHIPPED["aws-ofi-nccl-graph-capture"].verdict == "WARN"  # a crash, but only inside a graph capture


@pytest.mark.parametrize(("version", "spec", "holds"), [
    ("2.28.9", ">=2.28.9,<2.29.3", True), ("2.29.3", ">=2.28.9,<2.29.3", False), ("2.30.4", "2.30.4", True),
    ("2.4", "==2.4", True), ("2.4", "==2.4.0", True), ("2.7.0a0+nv25.06", ">=2.7", True), ("570.124", "<550", False),
    ("unknown", ">=1", False),
])
def test_versions_compare_at_the_precision_the_row_writes(version, spec, holds):
    assert known_issues.version_matches(version, spec) is holds


# -- the doctor ------------------------------------------------------------------------------

def user_file(tmp_path, rows, name="my-site"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"schema": 1, "name": name, "rows": rows}))
    return path


NCCL_226_HANGS_HERE = {"id": "site-nccl-226", "summary": "our NCCL/2.26.6 module hangs at init on the accel nodes",
                       "effect": "hang", "versions": {"nccl": "==2.26.6"},
                       "fix": "module load NCCL/2.27.7", "source": "https://example.org/site-status/2026-11"}


def test_a_new_row_is_one_entry_in_a_file_of_ones_own_and_a_hang_fails_with_its_fix(node, tmp_path):
    olivia_node(node)  # the bound NCCL answers 2.26.6 (FakeProbes), torch does not say
    path = user_file(tmp_path, [NCCL_226_HANGS_HERE])
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline", "--known-issues", str(path)], JOB,
                             FakeProbes(torch=TORCH_WITHOUT_NCCL))
    check = checks["known issue site-nccl-226"]
    assert code == 1 and check["status"] == "FAIL"
    assert check["detail"] == ("nccl 2.26.6: our NCCL/2.26.6 module hangs at init on the accel nodes "
                               "(hang; https://example.org/site-status/2026-11)")
    assert check["fix"] == "module load NCCL/2.27.7"
    # The same row through DDP_KNOWN_ISSUES, and a slowdown only warns.
    slow = user_file(tmp_path, [{**NCCL_226_HANGS_HERE, "effect": "slow"}], "slow-site")
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {**JOB, "DDP_KNOWN_ISSUES": str(slow)},
                             FakeProbes(torch=TORCH_WITHOUT_NCCL))
    assert code == 0 and checks["known issue site-nccl-226"]["status"] == "WARN"


def test_without_a_match_the_check_says_what_the_node_loads(node):
    olivia_node(node)
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB, FakeProbes(torch=TORCH_WITHOUT_NCCL))
    check = checks["known issues"]
    assert check["status"] == "OK"
    assert check["detail"].startswith(f"none of {len(SHIPPED)} known problem(s) matches: nccl 2.26.6 "
                                      "(/opt/nccl/lib/libnccl.so.2), aws-ofi-nccl ?, libfabric 2.3 "
                                      "(/opt/libfabric/lib64/libfabric.so.1)")


def test_the_plugins_version_is_read_from_its_package_string(node):
    """aws-ofi-nccl logs "Initializing " PACKAGE_STRING (src/nccl_ofi_net.cpp): the string is in the library."""
    olivia_node(node, plugin=False)
    build_library(node.root / "opt/aws-ofi-nccl/lib/libnccl-net.so", "libnccl-net.so",
                  source='const char *package = "Initializing aws-ofi-nccl 1.16.3";\n')
    assert plugin_version(str(node.root / "opt/aws-ofi-nccl/lib/libnccl-net.so")) == "1.16.3"
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline"], JOB)
    check = checks["known issue aws-ofi-nccl-graph-capture"]
    assert code == 0 and check["status"] == "WARN"
    assert check["detail"].startswith("aws-ofi-nccl 1.16.3, accelerator nvidia: the OFI plugin's GPU memory")
    assert check["fix"].startswith("aws-ofi-nccl 1.21.0 or later")


def laif_node(node, base=LAIF_ROCM7):
    node.cxi(4)
    node.file("/usr/lib/x86_64-linux-gnu/libfabric.so.1")
    node.file("/opt/rocm/lib/librccl.so.1")
    node.file("/opt/rocm/lib/librccl-net.so")
    node.file("/usr/lib/x86_64-linux-gnu/libcxi.so.1")
    node.file("/etc/ld.so.conf.d/rocm-30.conf", "/opt/rocm/lib\n/usr/lib/x86_64-linux-gnu\n")
    node.file("/.singularity.d/labels.json", json.dumps({known_issues.BASE_LABEL: base}))


LUMI_JOB = {**JOB, "SLURMD_NODENAME": "nid005000", "SLURM_JOB_NODELIST": "nid[005000-005001]",
            "SLURM_STEP_NODELIST": "nid[005000-005001]", "SINGULARITY_BIND": "/opt/cray", "HOME": "/users/u"}


def test_on_the_laif_rocm7_image_a_gdr_level_set_anywhere_fails_with_the_fix(node):
    laif_node(node)
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], {**LUMI_JOB, "NCCL_NET_GDR_LEVEL": "PHB"})
    check = checks["known issue laifs-28-gdr-level"]
    assert code == 1 and check["status"] == "FAIL"
    assert check["detail"].startswith(f"base_image {LAIF_ROCM7}, NCCL_NET_GDR_LEVEL PHB: multi-node torch.distributed "
                                      "init deadlocks")
    assert check["fix"].startswith("unset NCCL_NET_GDR_LEVEL")
    # LUMI's 2024 course set it to 3; a stale ~/.nccl.conf line does the same where nothing else sets it.
    node.file("/users/u/.nccl.conf", "NCCL_NET_GDR_LEVEL=3\n")
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB)
    assert code == 1 and checks["known issue laifs-28-gdr-level"]["detail"].startswith(
        f"base_image {LAIF_ROCM7}, NCCL_NET_GDR_LEVEL 3: ")
    conf = checks["nccl config files"]
    assert conf["status"] == "WARN"
    assert conf["detail"].startswith("~/.nccl.conf (/users/u/.nccl.conf) line 1: NCCL_NET_GDR_LEVEL=3 (applies) goes "
                                     "against site lumi, which leaves it unset: left to RCCL")


def test_on_the_laif_rocm7_image_without_a_gdr_level_nothing_matches(node):
    laif_node(node)
    code, checks, _ = doctor(node, ["--site", "lumi", "--offline"], LUMI_JOB)
    assert checks["known issues"]["status"] == "OK", checks["known issues"]
    assert f"base_image {LAIF_ROCM7}" in checks["known issues"]["detail"]


@pytest.mark.parametrize(("rows", "problem"), [
    ([{**NCCL_226_HANGS_HERE, "effect": "wedged"}], "rows[0].effect must be one of hang, crash, corrupt, slow"),
    ([{**NCCL_226_HANGS_HERE, "versions": {"nccl": "2.26.x"}}], "rows[0].versions.nccl has '2.26.x', not OP VERSION"),
    ([{**NCCL_226_HANGS_HERE, "versions": {"ncl": "2.26.6"}}], "rows[0].versions names 'ncl'; use nccl"),
    ([{**NCCL_226_HANGS_HERE, "source": ""}], "rows[0].source must be a public source"),
    ([{**NCCL_226_HANGS_HERE, "versions": {}}], "rows[0] names no version and no setting"),
    ([{**NCCL_226_HANGS_HERE, "effcet": "hang"}], "rows[0] has unknown key(s) effcet"),
    ([{**NCCL_226_HANGS_HERE, "id": "laifs-28-gdr-level"}], "known issue 'laifs-28-gdr-level' is in "),
])
def test_a_bad_row_of_ones_own_is_one_line_naming_the_file_and_the_key(tmp_path, rows, problem):
    path = user_file(tmp_path, rows)
    with pytest.raises(LaunchError) as raised:
        known_issues.load_rows({known_issues.USER_FILES_VAR: str(path)})
    assert problem in str(raised.value) and "\n" not in str(raised.value)


def test_a_bad_file_of_ones_own_fails_the_doctor_in_one_line(node, tmp_path):
    olivia_node(node)
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline", "--known-issues", str(tmp_path / "none.json")],
                             JOB)
    assert code == 1 and checks["known issues"]["status"] == "FAIL"
    assert checks["known issues"]["detail"] == (f"known-issues file {tmp_path / 'none.json'} does not exist (named by "
                                                "DDP_KNOWN_ISSUES or --known-issues): fix the path")


# -- the preflight's verdict -----------------------------------------------------------------

def report(*checks) -> str:
    return json.dumps({"ok": not any(c[1] == "FAIL" for c in checks),
                       "checks": [{"name": n, "status": s, "detail": d, "fix": f} for n, s, d, f in checks]})


def test_a_hang_on_every_node_stops_the_job_in_one_line_and_warnings_are_printed(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hang = ("known issue laifs-28-gdr-level", "FAIL", "base_image x, NCCL_NET_GDR_LEVEL PHB: init deadlocks (hang; s)",
            "unset NCCL_NET_GDR_LEVEL")
    slow = ("known issue nccl-226-gdr-c2c", "WARN", "nccl 2.26.6, gpu gh200: GDR off (slow; env.rst)",
            "NCCL_NET_GDR_C2C=1")
    paths = []
    for node in ("nid001000", "nid001001"):
        paths.append(tmp_path / f"doctor-{node}.json")
        paths[-1].write_text(report(hang))
    assert q.main(["add", "--by", "doctor", "--nodes", "2", str(run_dir), *map(str, paths)]) == EXIT_USAGE
    assert capsys.readouterr().out.splitlines() == [
        "preflight: ddp-launch doctor fails 'known issue laifs-28-gdr-level' on every node of the job (2 of 2): "
        "base_image x, NCCL_NET_GDR_LEVEL PHB: init deadlocks (hang; s): a setup problem, not a bad node, so nothing "
        "is excluded or requeued; fix: unset NCCL_NET_GDR_LEVEL"]
    for path in paths:
        path.write_text(report(slow, ("torch", "OK", "2.8", "")))
    assert q.main(["add", "--by", "doctor", "--nodes", "2", str(run_dir), *map(str, paths)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "preflight: warning: known issue nccl-226-gdr-c2c on nodes nid001000, nid001001: nccl 2.26.6, gpu gh200: "
        "GDR off (slow; env.rst); fix: NCCL_NET_GDR_C2C=1"]
