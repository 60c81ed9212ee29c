"""What our scripts and images rely on Apptainer for, asked of the real Apptainer.

Each test states a rule from the Apptainer user guide and runs it with the image built by
`make build-x86` from containers/gpu.def, as the cluster's unprivileged test user.
"""
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import user_dir

pytestmark = pytest.mark.e2e

SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def apptainer(cluster, args: list, cwd: Path, env: dict | None = None, timeout: float = 300):
    return cluster.as_user(["apptainer", *args], env=env, cwd=user_dir(cwd), timeout=timeout)


def container_env(cluster, sif, tmp_path, *options: str, env: dict | None = None) -> dict:
    import json

    done = apptainer(cluster, ["exec", *options, sif, "python3", "-c", SHOW_ENV], tmp_path, env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# "Environment and Metadata" (https://apptainer.org/docs/user/main/environment_and_metadata.html):
# the host environment passes in; the image's %environment is sourced after it, so it wins;
# APPTAINERENV_X sets X last.

def test_the_host_environment_passes_in_but_the_images_environment_wins(cluster, sif, tmp_path):
    seen = container_env(cluster, sif, tmp_path, env={"FROM_HOST": "yes", "PYTHONPATH": "/host/python"})

    assert seen["FROM_HOST"] == "yes"
    # gpu.def's `export PYTHONPATH=/opt/ddp/python` replaces the host's (and the base image's).
    assert seen["PYTHONPATH"] == "/opt/ddp/python"
    assert seen["PATH"].split(":")[0] == "/opt/ddp/bin"


def test_apptainerenv_overrides_the_images_environment(cluster, sif, tmp_path):
    seen = container_env(cluster, sif, tmp_path, env={"APPTAINERENV_PYTHONPATH": "/mine",
                                                       "APPTAINERENV_DDP_EXTRA": "set"})

    assert seen["PYTHONPATH"] == "/mine"
    assert seen["DDP_EXTRA"] == "set"


def test_cleanenv_keeps_the_host_environment_out_but_not_the_images(cluster, sif, tmp_path):
    seen = container_env(cluster, sif, tmp_path, "--cleanenv", env={"FROM_HOST": "yes", "SLURM_JOB_ID": "42"})

    assert "FROM_HOST" not in seen and "SLURM_JOB_ID" not in seen
    assert seen["PYTHONPATH"] == "/opt/ddp/python"


def test_the_slurm_job_variables_reach_the_runscript(cluster, sif, tmp_path):
    # The launcher plans from SLURM_* inside the container: `apptainer run` must pass them.
    done = apptainer(cluster, ["run", sif, "--dry-run", "--cpu-workers", "2"], tmp_path,
                     {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
                      "SLURM_NNODES": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]",
                      "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
                      "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
                      "SLURMD_NODENAME": "node2"})

    assert done.returncode == 0, done.stderr
    assert "--nnodes=2" in done.stdout and "--rdzv-id=42.0" in done.stdout


# "Bind Paths and Mounts" (https://apptainer.org/docs/user/main/bind_paths_and_mounts.html).

def test_a_bind_to_a_target_missing_from_the_image_is_created(cluster, sif, tmp_path):
    source = user_dir(tmp_path / "host-dir")
    (source / "marker").write_text("bound\n")

    done = apptainer(cluster, ["exec", sif, "cat", "/opt/not-in-image/marker"], tmp_path,
                     {"APPTAINER_BIND": f"{source}:/opt/not-in-image"})

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "bound"


def test_home_tmp_and_the_working_directory_are_bound_by_default(cluster, sif, tmp_path):
    work = user_dir(tmp_path / "work")
    (work / "here").write_text("cwd\n")

    done = apptainer(cluster, ["exec", sif, "sh", "-c", 'pwd; echo "$HOME"; ls -d /tmp "$HOME" && cat here'], work)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == str(work)
    assert lines[1] == "/home/ddp-e2e"
    assert lines[-1] == "cwd"


# "Definition Files": %help, %labels, %arguments.

def test_run_help_shows_the_help_section_with_its_arguments_filled_in(cluster, sif, tmp_path):
    done = apptainer(cluster, ["run-help", sif], tmp_path)

    assert done.returncode == 0, done.stderr
    assert "for amd64 GPU nodes" in done.stdout
    assert 'Default site profile: ""' in done.stdout
    assert "{{" not in done.stdout


def test_inspect_labels_shows_the_empty_site_of_the_x86_image(cluster, sif, tmp_path):
    # An empty %arguments default (SITE=) needs Apptainer >= 1.3 (apptainer#1584).
    done = apptainer(cluster, ["inspect", "--labels", sif], tmp_path)

    assert done.returncode == 0, done.stderr
    labels = dict(re.findall(r"^(\S+): ?(.*)$", done.stdout, re.M))
    assert labels["org.ddp.architecture"] == "amd64"
    assert labels["org.ddp.site"] == ""
    assert labels["org.opencontainers.image.title"] == "ddp-train"


# Exit codes: `apptainer exec|run` exits with the container process's code.

@pytest.mark.parametrize("code", [0, 1, 2, 75])
def test_the_exit_code_comes_through_apptainer(cluster, sif, tmp_path, code):
    done = apptainer(cluster, ["exec", sif, "sh", "-c", f"exit {code}"], tmp_path)

    assert done.returncode == code


def test_a_usage_mistake_in_the_runscript_exits_2(cluster, sif, tmp_path):
    done = apptainer(cluster, ["run", sif, "--no-such-flag"], tmp_path)

    assert done.returncode == 2
    assert "--no-such-flag" in done.stderr


# How the SIF is mounted, as the doctor reports it.

def test_the_doctor_says_the_sif_is_mounted_by_squashfuse_and_warns(cluster, sif, tmp_path):
    # Unprivileged Apptainer mounts a SIF with squashfuse where /dev/fuse is usable (here:
    # the cluster root's private node); slow for many processes (apptainer#665).
    done = apptainer(cluster, ["exec", sif, "ddp-launch", "doctor", "--offline"], tmp_path)

    lines = [line for line in done.stdout.splitlines() if re.match(r"^\w+\s+image mount:", line)]
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith("WARN") and "squashfuse" in lines[0]


# The fake nvidia-smi the spare-node tests put on one node (tests/unit/doctor/data/gpu-health/bin):
# APPTAINERENV_PREPEND_PATH puts a directory first on the container's PATH, after the image's
# %environment ("Environment and Metadata"), and the doctor in the real image reads it.
GPU_HEALTH_FAKES = Path(__file__).resolve().parents[1] / "unit" / "doctor" / "data" / "gpu-health"


def test_a_fake_nvidia_smi_on_the_containers_path_fails_the_named_nodes_gpu_health(cluster, sif, tmp_path):
    fakes = user_dir(tmp_path / "gpu-health")
    shutil.copytree(GPU_HEALTH_FAKES, fakes, dirs_exist_ok=True)
    env = {"APPTAINERENV_PREPEND_PATH": str(fakes / "bin"), "FAKE_NVIDIA_SMI_CASES": "node2:ecc"}
    seen = {}
    for node in ("node1", "node2"):
        done = apptainer(cluster, ["exec", sif, "ddp-launch", "doctor", "--offline", "--json"], tmp_path,
                         {**env, "SLURMD_NODENAME": node})
        checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
        seen[node] = (done.returncode, checks["gpu health"])

    assert seen["node1"][1]["status"] == "OK", seen["node1"]
    assert seen["node1"][1]["detail"].startswith("4 GPU(s) listed by nvidia-smi")
    assert seen["node2"][0] == 1 and seen["node2"][1]["status"] == "FAIL"
    assert seen["node2"][1]["detail"] == ("uncorrectable ECC errors: GPU 2 (00000000:00:08.0) "
                                          "ecc_errors/volatile/dram_uncorrectable=2")
