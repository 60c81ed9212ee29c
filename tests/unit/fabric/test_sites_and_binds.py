"""Site profiles (schema, version discovery) and `ddp-launch binds` against fake host trees."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_launch import binds as binds_cli
from ddp_launch.errors import LaunchError
from ddp_launch.sites import (
    apptainer_bind_value, available_sites, load_site, parse_profile, read_profile, resolve_binds, version_key,
)

REPO = Path(__file__).resolve().parents[3]
SITES = REPO / "containers" / "sites"


def olivia_host(node, libfabric_versions=("1.22.0", "2.3.1")):
    for version in libfabric_versions:
        node.directory(f"/opt/cray/libfabric/{version}/lib64")
        node.directory(f"/opt/cray/libfabric/{version}/include")
    node.directory("/cluster/work/support/nccl/lib")
    node.file("/usr/lib64/libcxi.so.1")
    node.directory("/opt/nvidia/hpc_sdk/Linux_aarch64/24.11/compilers/lib")
    node.directory("/opt/nvidia/hpc_sdk/Linux_aarch64/25.5/compilers/lib")


def run_binds(argv, env=None):
    out, err = io.StringIO(), io.StringIO()
    code = binds_cli.run(argv, env or {}, out, err)
    return code, out.getvalue().strip(), err.getvalue()


@pytest.mark.parametrize("name", ["olivia", "raven", "rcp", "generic"])
def test_shipped_profiles_validate(name):
    profile = read_profile(str(SITES / f"{name}.json"))
    assert profile.name == name


def test_every_shipped_profile_is_listed():
    assert set(available_sites({})) >= {"olivia", "raven", "rcp", "generic"}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("fabric"), "'fabric' must be a non-empty string"),
        (lambda d: d.update(fabric="token-ring"), "'fabric' must be one of"),
        (lambda d: d.update(colour="blue"), "unknown key(s) colour"),
        (lambda d: d["env"].update(FI_PROVIDER="cxi"), "env FI_PROVIDER must be"),
        (lambda d: d["binds"][0].pop("source"), "'source' must be a non-empty string"),
        (lambda d: d["binds"][0].update(target="relative/path"), "'target' must be an absolute path"),
        (lambda d: d["binds"][1].update(target=d["binds"][0]["target"]), "two binds share the target"),
        (lambda d: d.update(name="raven"), "the file is named olivia.json"),
    ],
)
def test_bad_profile_names_the_problem(change, message):
    data = json.loads((SITES / "olivia.json").read_text())
    change(data)
    with pytest.raises(LaunchError, match="bad site profile .*olivia.json") as error:
        parse_profile(data, str(SITES / "olivia.json"))
    assert message in str(error.value)


def test_unparseable_profile_is_one_error(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(LaunchError, match=r"broken.json cannot be read"):
        load_site("broken", {"DDP_SITES_DIR": str(tmp_path)})


def test_unknown_site_lists_the_known_ones():
    with pytest.raises(LaunchError, match=r"unknown site 'atlantis' \(known: generic, lumi, olivia, raven, rcp"):
        load_site("atlantis", {})


def test_natural_version_order():
    assert sorted(["1.9.0", "2.3.1", "1.22.0", "1.15.2.0"], key=version_key) == ["1.9.0", "1.15.2.0", "1.22.0", "2.3.1"]


def test_newest_libfabric_is_chosen_and_reported(node):
    olivia_host(node)
    code, value, err = run_binds(["--site", "olivia", "--root", str(node.root)])
    assert code == 0
    assert f"{node.root}/opt/cray/libfabric/2.3.1:/opt/libfabric" in value.split(",")
    assert "1.22.0:" not in value
    assert "newest match of /opt/cray/libfabric/* (also found: 1.22.0)" in err


def test_loaded_module_root_beats_the_glob(node):
    olivia_host(node)
    node.directory("/cluster/software/libfabric/2.4.0/lib64")
    env = {"EBROOTLIBFABRIC": "/cluster/software/libfabric/2.4.0"}
    code, value, err = run_binds(["--site", "olivia", "--root", str(node.root)], env)
    assert f"{node.root}/cluster/software/libfabric/2.4.0:/opt/libfabric" in value.split(",")
    assert "$EBROOTLIBFABRIC (loaded module)" in err


def test_plugin_module_is_bound_when_loaded(node):
    olivia_host(node)
    node.directory("/cluster/software/aws-ofi-nccl/1.14.0/lib")
    env = {"EBROOTAWSMINOFIMINNCCL": "/cluster/software/aws-ofi-nccl/1.14.0"}
    _, value, _ = run_binds(["--site", "olivia", "--root", str(node.root)], env)
    assert f"{node.root}/cluster/software/aws-ofi-nccl/1.14.0:/opt/aws-ofi-nccl" in value.split(",")


def test_optional_bind_missing_is_skipped(node):
    olivia_host(node)
    _, value, err = run_binds(["--site", "olivia", "--root", str(node.root)])
    assert "/opt/aws-ofi-nccl" not in value
    assert "aws-ofi-nccl: - -> /opt/aws-ofi-nccl  (not found; optional, skipped)" in err


def test_cxi_is_bound_as_one_file_not_all_of_usr_lib64(node):
    olivia_host(node)
    _, value, _ = run_binds(["--site", "olivia", "--root", str(node.root)])
    assert f"{node.root}/usr/lib64/libcxi.so.1:/opt/host-libs/libcxi.so.1" in value.split(",")
    assert not any(entry.endswith(":/usr/lib64") for entry in value.split(","))


def test_missing_required_bind_names_the_path(node):
    olivia_host(node, libfabric_versions=())
    with pytest.raises(LaunchError, match=r"bind libfabric: no host path found \(\$EBROOTLIBFABRIC is unset and nothing matches /opt/cray/libfabric/\*\)"):
        run_binds(["--site", "olivia", "--root", str(node.root)])


def test_module_root_that_does_not_exist_is_an_error(node):
    olivia_host(node)
    with pytest.raises(LaunchError, match="EBROOTNCCL is /gone/nccl but that path does not exist"):
        run_binds(["--site", "olivia", "--root", str(node.root)], {"EBROOTNCCL": "/gone/nccl"})


def test_existing_apptainer_bind_entries_come_first(node):
    olivia_host(node)
    _, value, _ = run_binds(["--site", "olivia", "--root", str(node.root), "--quiet"], {"APPTAINER_BIND": "/cluster/work"})
    assert value.split(",")[0] == "/cluster/work"


# Which of the user's binds the printed value keeps: those the runtime that reads it would have read.
# SingularityCE: SINGULARITY_BIND (SingularityCE user guide, "Bind Paths and Mounts",
# https://docs.sylabs.io/guides/latest/user-guide/bind_paths_and_mounts.html). Apptainer: APPTAINER_BIND,
# and SINGULARITY_BIND only "when their respective APPTAINER_ ... counterparts are not set" (Apptainer
# user guide, "Singularity Compatibility", https://apptainer.org/docs/user/main/singularity_compatibility.html).
@pytest.mark.parametrize(("runtime", "env", "kept"), [
    ("singularity", {"SINGULARITY_BIND": "/scratch/me,/proj:/p"}, "/scratch/me,/proj:/p"),
    ("singularity", {"APPTAINER_BIND": "/a"}, ""),  # SingularityCE does not read it
    ("apptainer", {"SINGULARITY_BIND": "/scratch/me"}, "/scratch/me"),
    ("apptainer", {"APPTAINER_BIND": "/a", "SINGULARITY_BIND": "/s"}, "/a"),
    ("apptainer", {"APPTAINER_BIND": "", "SINGULARITY_BIND": "/s"}, ""),  # set, though empty: the legacy one is not read
    ("apptainer", {}, ""),
])
def test_the_users_binds_are_those_the_runtime_reads(runtime, env, kept):
    assert binds_cli.user_binds(env, runtime) == kept


def test_a_users_singularity_bind_comes_first_in_the_value_for_singularity():
    code, value, _ = run_binds(["--site", "generic", "--runtime", "singularity", "--quiet"],
                               {"SINGULARITY_BIND": "/scratch/me", "APPTAINER_BIND": "/not/read"})
    assert (code, value) == (0, "/scratch/me")


def test_a_users_singularity_bind_is_not_lost_when_apptainer_bind_is_exported_instead():
    # Exporting APPTAINER_BIND makes Apptainer ignore SINGULARITY_BIND: its entries must move into the value.
    _, value, _ = run_binds(["--site", "generic", "--quiet"], {"SINGULARITY_BIND": "/scratch/me"})
    assert value == "/scratch/me"


def test_the_runtime_is_the_job_scripts_setting_else_the_site_profiles(tmp_path):
    (tmp_path / "lab.json").write_text(json.dumps({
        "schema": 1, "name": "lab", "fabric": "auto", "binds": [],
        "container_runtime": {"command": "singularity", "source": "this test"}}))
    env = {"DDP_SITES_DIR": str(tmp_path), "SINGULARITY_BIND": "/s", "APPTAINER_BIND": "/a"}
    assert run_binds(["--site", "lab", "--quiet"], env)[1] == "/s"  # the profile's singularity
    assert run_binds(["--site", "lab", "--quiet"], {**env, "DDP_CONTAINER_RUNTIME": "apptainer"})[1] == "/a"
    assert run_binds(["--site", "lab", "--quiet", "--runtime", "apptainer"], env)[1] == "/a"


def test_site_without_binds_prints_an_empty_value():
    code, value, _ = run_binds(["--site", "raven"])
    assert code == 0 and value == ""


def test_site_from_the_environment():
    code, _, _ = run_binds([], {"DDP_LAUNCH_SITE": "generic"})
    assert code == 0


def test_no_site_is_an_error():
    with pytest.raises(LaunchError, match="no site given"):
        run_binds([])


def test_path_with_comma_cannot_be_carried(node):
    node.directory("/opt/odd,dir")
    profile = parse_profile(
        {"schema": 1, "name": "x", "fabric": "auto",
         "binds": [{"name": "odd", "glob": "/opt/odd*", "target": "/opt/odd", "source": "test"}]}, "x.json")
    with pytest.raises(LaunchError, match="contains ',' or ':'"):
        apptainer_bind_value(resolve_binds(profile, {}, str(node.root)))


@pytest.mark.parametrize("entry", [["-m", "ddp_launch", "binds"], ["-m", "ddp_launch.binds"]], ids=["cli", "host-entry"])
def test_binds_cli_one_line_error_and_exit_2(node, entry):
    result = subprocess.run(
        [sys.executable, *entry, "--site", "olivia", "--root", str(node.root)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("ddp-launch: error: bind ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_binds_cli_prints_the_value(node):
    olivia_host(node)
    result = subprocess.run(
        [sys.executable, "-m", "ddp_launch", "binds", "--site", "olivia", "--root", str(node.root), "--quiet"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"{node.root}/opt/cray/libfabric/2.3.1:/opt/libfabric" in result.stdout


def test_bad_profile_through_the_cli_is_one_line_exit_2(tmp_path):
    (tmp_path / "lab.json").write_text('{"schema": 1, "name": "lab", "fabric": "carrier-pigeon", "binds": []}')
    result = subprocess.run(
        [sys.executable, "-m", "ddp_launch", "binds", "--site", "lab"],
        # PYTHONPATH: the package from this checkout also where it is not installed (a GPU machine's copy).
        env={"DDP_SITES_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "entrypoints")},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == f"ddp-launch: error: bad site profile {tmp_path}/lab.json: 'fabric' must be one of slingshot, infiniband, ethernet, auto, got 'carrier-pigeon'\n"


def test_each_job_script_runs_the_image_with_its_sites_container_runtime():
    # The site profile says which command runs the image there (LUMI: SingularityCE's singularity,
    # https://docs.lumi-supercomputer.eu/software/containers/singularity/), and doctor's fixes name it;
    # a job script whose DDP_CONTAINER_RUNTIME said otherwise would run a command the site lacks.
    checked = 0
    for script in sorted((REPO / "slurm").glob("*.sh")):
        text = script.read_text()
        site = re.search(r"^ddp::default DDP_SITE (\S+)$", text, re.M)
        if site is None:
            continue
        runtime = re.search(r"^ddp::default DDP_CONTAINER_RUNTIME (\S+)$", text, re.M)
        assert (runtime.group(1) if runtime else "apptainer") == load_site(site.group(1), {}).container_runtime, script.name
        checked += 1
    assert checked >= 9
    assert load_site("lumi", {}).container_runtime == "singularity"
