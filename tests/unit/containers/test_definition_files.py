"""Definition files: parsed with spython, shell bodies shellchecked, entry run on the host as the image runs it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from definitions_paths import BUILDS, CONTAINERS, DEFINITIONS, REPO
from deffile import build_arguments, render, sections
from spython.main.parse.parsers import SingularityParser

REQUIRED_SECTIONS = {"arguments", "labels", "files", "environment", "runscript", "test", "help"}
SHELL_SECTIONS = ("post", "environment", "runscript", "test")
RUNSCRIPT = 'exec ddp-launch "$@"'


def text(name: str) -> str:
    return (CONTAINERS / name).read_text()


def spython_recipe(name: str, tmp_path: Path):
    rendered = tmp_path / name
    rendered.write_text(render(text(name)))
    return next(iter(SingularityParser(str(rendered)).recipe.values()))


@pytest.mark.parametrize("name", DEFINITIONS)
def test_required_sections_present(name):
    assert REQUIRED_SECTIONS <= set(sections(text(name)))


@pytest.mark.parametrize("name", DEFINITIONS)
def test_runscript_execs_the_entrypoint(name, tmp_path):
    assert spython_recipe(name, tmp_path).cmd.strip() == RUNSCRIPT


@pytest.mark.parametrize("name", DEFINITIONS)
def test_files_sources_exist_in_the_repo(name, tmp_path):
    files = spython_recipe(name, tmp_path).files
    assert files, "no %files"
    for entry in files:
        source = entry[0] if isinstance(entry, list) else entry.split()[0]
        assert (REPO / source).exists(), f"{name}: %files source {source} is missing"


@pytest.mark.parametrize("name", DEFINITIONS)
def test_both_packages_and_site_profiles_are_baked_in(name, tmp_path):
    targets = [(e[1] if isinstance(e, list) else e.split()[1]) for e in spython_recipe(name, tmp_path).files]
    assert {"/opt/ddp/python/ddp_launch", "/opt/ddp/python/ddp_contract", "/opt/ddp/python/ddp_train",
            "/opt/ddp/python/ddp_bench", "/opt/ddp/sites", "/opt/ddp/bin/ddp-launch"} <= set(targets)


@pytest.mark.parametrize("name", DEFINITIONS)
def test_labels_carry_version_commit_base_and_arch(name, tmp_path):
    rendered = render(text(name), {"VERSION": "9.9.9", "GIT_COMMIT": "abc1234"})
    labels = sections(rendered)["labels"]
    assert "org.opencontainers.image.version 9.9.9" in labels
    assert "org.opencontainers.image.revision abc1234" in labels
    assert f"org.opencontainers.image.base.name {build_arguments(text(name))['BASE_IMAGE']}" in labels
    assert "org.ddp.architecture " in labels


def test_gpu_image_runs_nothing_inside_at_build_time():
    assert "post" not in sections(text("gpu.def")), "a %post would need arm64 emulation on the x86_64 login node"


def test_the_gpu_base_is_the_one_the_containers_readme_documents():
    # Whatever the base is, a user reads it in containers/README.md's build-argument table: a new NGC
    # release changes the definition and the table together, or this fails.
    base = build_arguments(text("gpu.def"))["BASE_IMAGE"]
    table = (CONTAINERS / "README.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| `BOOTSTRAP`, `BASE_IMAGE` |"))
    assert f"`{base}`" in row, row


def test_olivia_base_can_be_a_local_sif():
    _, olivia = BUILDS["olivia"]
    rendered = render(text("gpu.def"), {**olivia, "BOOTSTRAP": "localimage", "BASE_IMAGE": "/cluster/base.sif"})
    assert rendered.startswith("Bootstrap: localimage\nFrom: /cluster/base.sif\n")


def test_lumi_is_the_gpu_definition_on_a_rocm_base_sif():
    # LUMI's base is a pre-built SIF (or its Docker Hub copy): only the bootstrap, the base and
    # the build arguments differ from the NGC image, so no second definition file.
    name, lumi = BUILDS["lumi"]
    base = "/appl/local/laifs/containers/x/lumi-multitorch-torch-x.sif"
    rendered = render(text(name), {**lumi, "BOOTSTRAP": "localimage", "BASE_IMAGE": base})
    assert (name, rendered.splitlines()[:2]) == ("gpu.def", ["Bootstrap: localimage", f"From: {base}"])
    assert labels("lumi")["org.ddp.site"] == "lumi" and labels("lumi")["org.ddp.architecture"] == "amd64"


def test_lumi_help_names_its_architecture_and_site():
    help_text = sections(render(text("gpu.def"), BUILDS["lumi"][1]))["help"]
    assert "for amd64 GPU nodes" in help_text and 'Default site profile: "lumi"' in help_text


def labels(build: str) -> dict:
    name, arguments = BUILDS[build]
    # Apptainer's rule: key, then the rest of the line as the value, "" when there is none
    # (pkg/build/types/parser/deffile.go, GetLabels).
    pairs = (line.strip().split(" ", 1) for line in sections(render(text(name), arguments))["labels"].splitlines())
    return {pair[0]: (pair[1].strip() if len(pair) == 2 else "") for pair in pairs if pair[0]}


@pytest.mark.parametrize("build, architecture, site", [("olivia", "arm64", "olivia"), ("lumi", "amd64", "lumi"),
                                                       ("x86", "amd64", "")])
def test_build_arguments_name_the_architecture_and_site(build, architecture, site):
    assert labels(build)["org.ddp.architecture"] == architecture
    assert labels(build)["org.ddp.site"] == site


def run_environment(build: str, env: dict) -> dict:
    """The image's %environment as Apptainer sources it (/bin/sh), and the variables it leaves."""
    name, arguments = BUILDS[build]
    body = sections(render(text(name), arguments))["environment"]
    done = subprocess.run(["sh", "-c", body + "\nenv -0"], env=env, capture_output=True, text=True, check=True)
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if item)


@pytest.mark.parametrize("build, site", [("olivia", "olivia"), ("lumi", "lumi"), ("x86", ""), ("cpu", None)])
def test_site_build_argument_is_the_default_site_profile(build, site):
    assert run_environment(build, {"PATH": "/usr/bin:/bin"}).get("DDP_LAUNCH_SITE") == site


@pytest.mark.parametrize("build", ["olivia", "lumi", "x86"])
def test_a_site_the_user_set_wins_over_the_images_default(build):
    # Apptainer sources %environment after passing the host's variables in, so a plain
    # export would override the user ("Environment and Metadata", Environment variable precedence).
    assert run_environment(build, {"PATH": "/usr/bin:/bin", "DDP_LAUNCH_SITE": "raven"})["DDP_LAUNCH_SITE"] == "raven"


def test_help_names_the_architecture_and_the_default_site():
    _, olivia = BUILDS["olivia"]
    help_text = sections(render(text("gpu.def"), olivia))["help"]
    assert "for arm64 GPU nodes" in help_text and 'Default site profile: "olivia"' in help_text


def test_templates_in_comments_stay_as_written():
    # Apptainer leaves a {{ NAME }} after a `#` alone (internal/pkg/build/args/reader.go),
    # so a comment may name an argument that has no default.
    assert render("%arguments\n    A=1\n\n%post\n    echo {{ A }}  # not {{ B }}\n") == "%post\n    echo 1  # not {{ B }}\n"


def test_unknown_build_argument_is_an_error():
    with pytest.raises(KeyError, match="NOPE"):
        render("From: {{ NOPE }}\n")


@pytest.mark.parametrize("section", ["files", "runscript", "test"])
def test_shared_sections_are_identical_across_images(section):
    bodies = {name: sections(text(name))[section] for name in DEFINITIONS}
    assert len(set(bodies.values())) == 1, bodies


SHELLCHECK = shutil.which("shellcheck")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("name", DEFINITIONS)
@pytest.mark.parametrize("section", SHELL_SECTIONS)
def test_section_shell_is_shellcheck_clean(name, section, tmp_path):
    body = sections(render(text(name))).get(section)
    if body is None:
        return  # this image has no such section; the required ones are checked above
    script = tmp_path / f"{section}.sh"
    # Apptainer runs these with /bin/sh; %runscript receives the container's arguments.
    script.write_text("#!/bin/sh\n" + body)
    result = subprocess.run([SHELLCHECK, "--shell=sh", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (apt-get install shellcheck)")
def test_wrapper_scripts_are_shellcheck_clean():
    scripts = sorted(str(p) for p in (CONTAINERS / "bin").iterdir())
    result = subprocess.run([SHELLCHECK, *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def run_runscript(name, args, env, tmp_path):
    script = tmp_path / "runscript.sh"
    script.write_text(sections(render(text(name)))["runscript"])
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=120)


DRY_RUN = ["--mode", "local", "--cpu-workers", "1", "--dry-run", "--", "--epochs", "3", "--run-dir", "runs/x y"]


@pytest.mark.parametrize("name", DEFINITIONS)
def test_runscript_reaches_ddp_launch_with_arguments_untouched(name, tmp_path, venv_bin):
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = run_runscript(name, DRY_RUN, env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("mode: local\n")
    assert "-m ddp_train --epochs 3 --run-dir 'runs/x y'" in result.stdout


def install_like_the_image(name: str, image_root: Path) -> None:
    """Copy %files to image_root as Apptainer would, to run the image's own wrappers."""
    for source, target in (line.split() for line in sections(text(name))["files"].splitlines() if line.strip()):
        destination = image_root / target.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, destination, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / source, destination)


@pytest.mark.parametrize("name", DEFINITIONS)
def test_environment_and_runscript_work_from_the_image_layout(name, tmp_path):
    image_root = tmp_path / "image"
    install_like_the_image(name, image_root)
    body = sections(render(text(name)))
    # Same shell text as the image, with /opt/ddp relocated under the fake image root.
    script = tmp_path / "entry.sh"
    script.write_text((body["environment"] + body["runscript"]).replace("/opt/ddp", f"{image_root}/opt/ddp"))
    python_dir = Path(shutil.which("python3") or "/usr/bin/python3").parent
    env = {"PATH": f"{python_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(["sh", str(script), "binds", "--site", "raven"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ddp-launch binds: " not in result.stdout  # explanations go to stderr
    result = subprocess.run(["sh", str(script), "binds", "--site", "atlantis"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "unknown site 'atlantis'" in result.stderr
    assert f"{image_root}/opt/ddp/sites" in result.stderr  # profiles found where %files put them


# A SLURM build job (make build-olivia-job): Apptainer passes the job's environment into
# %test but no GPUs, since %test never gets --nv (Apptainer user guide, "Definition Files").
BUILD_JOB_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gh001",
                 "SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0",
                 "DDP_LAUNCH_SITE": "olivia"}


def _run_test_section(name, tmp_path, venv_bin, extra_env):
    script = tmp_path / "test.sh"
    script.write_text(sections(render(text(name)))["test"])  # verbatim: it starts with set -e
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": str(tmp_path), "DDP_DATA_DIR": str(tmp_path),
           **extra_env}
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.parametrize("name", ["gpu.def"])
@pytest.mark.parametrize("extra_env", [{}, BUILD_JOB_ENV], ids=["plain", "slurm-build-job-without-gpus"])
def test_test_section_passes_on_the_host_against_the_installed_packages(name, tmp_path, venv_bin, extra_env):
    result = _run_test_section(name, tmp_path, venv_bin, extra_env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "doctor: no failures" in result.stdout
    assert "OK    trainer: ddp_train.train imports" in result.stdout


@pytest.mark.parametrize("name", ["gpu.def"])
def test_test_section_still_fails_a_broken_image(name, tmp_path, venv_bin):
    # An image whose %files lost the site profiles (DDP_SITES_DIR points at nothing).
    build_job = {k: v for k, v in BUILD_JOB_ENV.items() if k != "DDP_LAUNCH_SITE"}
    result = _run_test_section(name, tmp_path, venv_bin, {**build_job, "DDP_SITES_DIR": str(tmp_path / "none")})

    assert result.returncode != 0
    assert "FAIL  site profiles: none found in" in result.stdout


@pytest.mark.parametrize("name", DEFINITIONS)
def test_test_section_stops_at_the_first_failure(name):
    # Apptainer judges %test by its exit status; without set -e a failing doctor would be hidden.
    assert sections(text(name))["test"].splitlines()[0] == "set -e"
