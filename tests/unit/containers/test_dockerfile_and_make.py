"""The generated Dockerfile (golden, exec-form ENTRYPOINT) and the Make targets' messages."""

from __future__ import annotations

import json
import platform
import subprocess

import pytest
from pathlib import Path
from deffile import build_arguments, render, sections
from definitions_paths import BUILDS, REPO
from dockerfile import generate

# The committed Dockerfile is the golden file: RunAI users build from it directly.
GOLDEN = REPO / "containers" / "Dockerfile"
ACCEPT = "make dockerfile"


@pytest.fixture
def dockerfile(monkeypatch) -> str:
    monkeypatch.chdir(REPO)
    return generate("containers/gpu.def", BUILDS["x86"][1])


def test_dockerfile_matches_golden(dockerfile):
    assert dockerfile == GOLDEN.read_text(), f"generated Dockerfile changed; if intended, accept it with: {ACCEPT}"


def entrypoint(text: str) -> list:
    lines = [line for line in text.splitlines() if line.startswith("ENTRYPOINT ")]
    assert len(lines) == 1, lines
    return json.loads(lines[0][len("ENTRYPOINT "):])


def test_entrypoint_is_exec_form_ddp_launch(dockerfile):
    assert entrypoint(dockerfile) == ["ddp-launch"]
    assert not any(line.startswith(("CMD ", "HEALTHCHECK ")) for line in dockerfile.splitlines())


def test_test_section_runs_at_build_time(dockerfile):
    assert "RUN ddp-launch doctor --image" in dockerfile.splitlines()


def test_docker_run_arguments_reach_ddp_launch(dockerfile, venv_bin, tmp_path):
    # `docker run IMAGE ARGS...` execs ENTRYPOINT + ARGS with no shell in between.
    argv = entrypoint(dockerfile) + ["--mode", "local", "--cpu-workers", "1", "--dry-run", "--", "--epochs", "2"]
    result = subprocess.run(argv, env={"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "-m ddp_train --epochs 2" in result.stdout


def test_runscript_other_than_the_entrypoint_is_refused(tmp_path):
    definition = tmp_path / "bad.def"
    definition.write_text("Bootstrap: docker\nFrom: python:3.12-slim\n\n%runscript\n    python3 train.py\n")
    with pytest.raises(ValueError, match="%runscript must be"):
        generate(str(definition), {})


def make(target: str, tmp_path, path="/usr/bin:/bin", *variables):
    # BUILD_MIN_FREE_GB=0: these tests are about arguments; test_build_scratch.py checks the space.
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), target, "SIF_DIR=" + str(tmp_path),
                           "BUILD_MIN_FREE_GB=0", *variables],
                          env={"PATH": path, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("target", ["build-olivia", "build-lumi", "build-x86", "build-cpu"])
def test_build_without_apptainer_says_how_to_get_it(target, tmp_path):
    result = make(target, tmp_path)
    assert result.returncode != 0
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: 'apptainer' not found on PATH") and "module load apptainer" in first


@pytest.mark.parametrize("target, definition, sif", [
    ("build-olivia", "containers/gpu.def", "train-olivia-arm64.sif"),
    ("build-lumi", "containers/gpu.def", "train-lumi-x86_64.sif"),
    ("build-x86", "containers/gpu.def", "train-x86_64.sif"),
    ("build-cpu", "containers/cpu.def", "train-cpu.sif"),
])
def test_build_prints_what_and_where(target, definition, sif, tmp_path):
    fake, log = fake_apptainer(tmp_path)  # records its argv, accepts only `build`
    result = make(target, tmp_path, f"{fake}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert f"building {definition}" in result.stdout and f"SIF: {tmp_path}/{sif}" in result.stdout
    argv = log.read_text().splitlines()
    assert argv[-2:] == [f"{tmp_path}/{sif}", definition]
    assert "GIT_COMMIT=" in " ".join(argv)


def build_args(argv: list) -> dict:
    return dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--build-arg")


@pytest.mark.parametrize("target, build", [("build-olivia", "olivia"), ("build-lumi", "lumi"), ("build-x86", "x86"),
                                           ("build-cpu", "cpu")])
def test_each_target_passes_its_images_build_arguments(target, build, tmp_path):
    fake, log = fake_apptainer(tmp_path)
    result = make(target, tmp_path, f"{fake}:/usr/bin:/bin", f"OLIVIA_BASE_SIF={tmp_path}/absent.sif",
                  f"LUMI_BASE_SIF={tmp_path}/absent.sif")
    assert result.returncode == 0, result.stderr
    passed = build_args(log.read_text().splitlines())
    definition, arguments = BUILDS[build]
    assert {name: passed.get(name) for name in ("ARCH", "SITE")} == {name: arguments.get(name) for name in ("ARCH", "SITE")}
    assert set(passed) <= set(build_arguments((REPO / "containers" / definition).read_text()))


def rendered_help(argv: list) -> str:
    """gpu.def's %help as `apptainer build` fills it in with the build arguments of argv (Apptainer's
    rule: a --build-arg over the %arguments default; deffile.render)."""
    return sections(render((REPO / "containers" / "gpu.def").read_text(), build_args(argv)))["help"]


@pytest.mark.parametrize("target, runtime, variable, flag, srun, site", [
    # LUMI runs SingularityCE's singularity, part of the OS, and has no apptainer
    # (https://docs.lumi-supercomputer.eu/software/containers/singularity/); SingularityCE reads
    # SINGULARITY_BIND (its user guide, "Bind Paths and Mounts"); its GCDs need --rocm; Slingshot's
    # steps need --network=disable_rdzv_get (HPE shs-ccl-docs; containers/sites/lumi.json).
    ("build-lumi", "singularity", "SINGULARITY_BIND", "--rocm", "srun --network=disable_rdzv_get", "lumi"),
    ("build-olivia", "apptainer", "APPTAINER_BIND", "--nv", "srun --network=disable_rdzv_get", "olivia"),
    ("build-x86", "apptainer", "APPTAINER_BIND", "--nv", "srun", "NAME"),
])
def test_each_images_help_is_its_sites(target, runtime, variable, flag, srun, site, tmp_path):
    fake, log = fake_apptainer(tmp_path)
    result = make(target, tmp_path, f"{fake}:/usr/bin:/bin", f"OLIVIA_BASE_SIF={tmp_path}/absent.sif",
                  f"LUMI_BASE_SIF={tmp_path}/absent.sif")
    assert result.returncode == 0, result.stderr
    text = rendered_help(log.read_text().splitlines())
    assert f'python3 -m ddp_launch.binds --site {site})"' in text and f"export {variable}=" in text, text
    assert f"{srun} {runtime} run {flag} train.sif --nodes 2" in text, text
    commands = [line.split()[0] for line in text.splitlines() if line.startswith("    ")]  # dedented: the examples
    assert set(commands) == {"export", "srun", runtime}, text  # no other runtime's command, anywhere
    other = {"apptainer": "singularity", "singularity": "apptainer"}[runtime]
    assert other not in text and other.upper() + "_BIND" not in text, text
    assert "{{" not in text


def test_a_site_profile_that_cannot_be_read_stops_the_build_before_apptainer_runs(tmp_path):
    fake, log = fake_apptainer(tmp_path)
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "lumi.json").write_text("{")
    result = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "build-lumi", f"SIF_DIR={tmp_path}",
                             "BUILD_MIN_FREE_GB=0", f"LUMI_BASE_SIF={tmp_path}/absent.sif"],
                            env={"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "DDP_SITES_DIR": str(sites)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not log.exists()
    assert "containers/image_help.py lumi printed nothing" in result.stderr, result.stderr


# `apptainer sif list` as Apptainer 1.4 prints it (the real one is read in tests/e2e/test_make_build.py).
SIF_LIST = """------------------------------------------------------------------------------
ID   |GROUP   |LINK    |SIF POSITION (start-end)  |TYPE
------------------------------------------------------------------------------
1    |1       |NONE    |32176-32208               |Def.FILE
2    |1       |NONE    |32208-33916               |JSON.Generic
4    |1       |NONE    |36864-287539200           |FS (Squashfs/*System/arm64)
"""


def fake_apptainer(tmp_path, version="1.4.5"):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    log = tmp_path / "apptainer.argv"
    (tmp_path / "sif-list.txt").write_text(SIF_LIST)
    (fake / "apptainer").write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "apptainer version {version}"; exit 0; }}\n'
        f'[ "$1 $2" = "sif list" ] && {{ cat "{tmp_path}/sif-list.txt"; exit 0; }}\n'
        f'[ "$1" = build ] || exit 64\nprintf "%s\\n" "$@" > "{log}"\n')
    (fake / "apptainer").chmod(0o755)
    # unsquashfs: records its argv and makes the -d directory.
    (fake / "unsquashfs").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/unsquashfs.argv"\n'
        'while [ $# -gt 0 ]; do [ "$1" = -d ] && mkdir -p "$2"; shift; done\n')
    (fake / "unsquashfs").chmod(0o755)
    return fake, log


def test_olivia_uses_the_prepulled_sif_when_present(tmp_path):
    base = tmp_path / "pytorch_nvidia_25.06_arm64.sif"
    base.write_bytes(b"")
    fake, log = fake_apptainer(tmp_path)
    result = make("build-olivia", tmp_path, f"{fake}:/usr/bin:/bin", f"OLIVIA_BASE_SIF={base}")
    assert result.returncode == 0, result.stderr
    argv = log.read_text().splitlines()
    assert "BOOTSTRAP=localimage" in argv
    if platform.machine() == "aarch64":
        assert f"BASE_IMAGE={base}" in argv
    else:
        # Apptainer will not open an arm64 SIF on x86_64: the squashfs partition (from
        # `sif list`) is unpacked in place and the build starts from that directory.
        unsquashfs = (tmp_path / "unsquashfs.argv").read_text().splitlines()
        assert unsquashfs[unsquashfs.index("-o") + 1] == "36864" and unsquashfs[-1] == str(base)
        rootfs = unsquashfs[unsquashfs.index("-d") + 1]
        assert f"BASE_IMAGE={rootfs}" in argv and rootfs.endswith("/pytorch_nvidia_25.06_arm64")
        assert not Path(rootfs).exists()  # removed after the build


@pytest.mark.parametrize("target", ["build-olivia", "build-lumi", "build-x86", "build-cpu"])
def test_build_with_an_apptainer_older_than_1_3_stops_in_one_line(target, tmp_path):
    # gpu.def's empty %arguments default (SITE=) fails on 1.2 (apptainer#1584).
    fake, log = fake_apptainer(tmp_path, version="1.2.5")
    result = make(target, tmp_path, f"{fake}:/usr/bin:/bin")
    assert result.returncode != 0
    assert result.stderr.splitlines()[0] == (
        "error: apptainer 1.2.5 is older than 1.3, which containers/*.def need (apptainer#1584): "
        "'module load apptainer/1.3' or newer")
    assert not log.exists()


def test_olivia_from_ngc_targets_arm64_and_skips_tests_off_arm(tmp_path):
    fake, log = fake_apptainer(tmp_path)
    result = make("build-olivia", tmp_path, f"{fake}:/usr/bin:/bin", f"OLIVIA_BASE_SIF={tmp_path}/absent.sif")
    assert result.returncode == 0, result.stderr
    argv = log.read_text().splitlines()
    assert argv[argv.index("--arch") + 1] == "arm64"
    assert ("--notest" in argv) == (platform.machine() != "aarch64")


BASE_IMAGES = json.loads((REPO / "containers" / "base-images.json").read_text())


def test_lumi_uses_its_sif_when_present_else_the_docker_hub_copy(tmp_path):
    # LUMI's SIF is an x86_64 image: built on directly, no unpacking as for Olivia's arm64 one.
    base = tmp_path / "lumi-multitorch-torch-u24r70f21m50t210-20260415_130625.sif"
    base.write_bytes(b"")
    fake, log = fake_apptainer(tmp_path)
    assert make("build-lumi", tmp_path, f"{fake}:/usr/bin:/bin", f"LUMI_BASE_SIF={base}").returncode == 0
    assert {"BOOTSTRAP=localimage", f"BASE_IMAGE={base}"} <= set(log.read_text().splitlines())
    assert not (tmp_path / "unsquashfs.argv").exists()
    base.unlink()
    assert make("build-lumi", tmp_path, f"{fake}:/usr/bin:/bin", f"LUMI_BASE_SIF={base}").returncode == 0
    argv = log.read_text().splitlines()
    assert {"BOOTSTRAP=docker", f"BASE_IMAGE={BASE_IMAGES['lumi']['docker']}"} <= set(argv)
    assert build_args(argv)["BASE_IMAGE"] == "lumiaifactory/lumi-multitorch:torch-u24r70f21m50t210"


@pytest.mark.parametrize("site", ["olivia", "lumi"])
def test_a_sites_base_sif_comes_from_base_images_json(site, tmp_path):
    # No *_BASE_SIF on the command line: the Makefile asks containers/base_image.py. On this
    # machine the cluster's SIF is absent, so the build pulls the registry image named beside it.
    fake, log = fake_apptainer(tmp_path)
    result = make(f"build-{site}", tmp_path, f"{fake}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert build_args(log.read_text().splitlines())["BASE_IMAGE"] == BASE_IMAGES[site]["docker"]
    assert "localimage" not in result.stdout


def test_base_is_a_build_argument_defaulting_to_the_definitions_base(dockerfile):
    # Docker and ch-image both take `ARG` before the first FROM as the FROM's default
    # (Dockerfile reference, "Understand how ARG and FROM interact"); ch-image 0.31 parses
    # only the $NAME form in FROM, not ${NAME}.
    lines = dockerfile.splitlines()
    start = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert lines[start:start + 3] == ["ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.06-py3",
                                      "FROM $BASE_IMAGE AS spython-base", "ARG BASE_IMAGE"]
    assert sum(line.startswith("FROM ") for line in lines) == 1


@pytest.mark.parametrize("name, value, line", [
    ("BASE_IMAGE", "example/base:1", "ARG BASE_IMAGE=example/base:1"),
    ("VERSION", "2.0.0", "ARG VERSION=2.0.0"),
    ("SITE", "olivia", "ARG SITE=olivia"),
])
def test_a_build_arg_changes_only_its_argument_default(monkeypatch, name, value, line):
    monkeypatch.chdir(REPO)
    default = generate("containers/gpu.def", {})
    other = generate("containers/gpu.def", {name: value})
    changed = [b for a, b in zip(default.splitlines(), other.splitlines()) if a != b]
    assert changed == [line]


def test_every_definition_argument_but_bootstrap_and_the_helps_is_a_docker_arg_with_its_default(dockerfile):
    # Docker scopes an ARG before FROM to the FROM line; the stage declares it again to use it.
    stage = dockerfile.split("\nFROM ", 1)[1].splitlines()
    declared = dict(line[len("ARG "):].partition("=")[::2] for line in stage if line.startswith("ARG "))
    defaults = {name: value for name, value in build_arguments((REPO / "containers" / "gpu.def").read_text()).items()
                if not name.startswith("HELP_")}  # %help's alone: a Dockerfile has no help
    assert set(declared) == set(defaults) - {"BOOTSTRAP"}
    assert {k: v.strip('"') for k, v in declared.items() if k != "BASE_IMAGE"} == \
        {k: v for k, v in defaults.items() if k not in ("BOOTSTRAP", "BASE_IMAGE")}
    assert "LABEL org.ddp.architecture ${ARCH}" in stage and "LABEL org.opencontainers.image.version ${VERSION}" in stage


def test_a_default_only_environment_line_becomes_a_plain_env(dockerfile):
    # `export X="${X:-v}"` keeps a user's X under Apptainer; Docker's ENV is already only a
    # default (`docker run -e`, a pod's env win), and ch-image refuses ${X:-v} (charliecloud #774).
    assert 'ENV DDP_LAUNCH_SITE="${SITE}"' in dockerfile.splitlines()


def test_files_are_copied_with_copy_which_ch_image_builds(dockerfile):
    # ch-image 0.31 ignores ADD ("not yet supported, ignored"), so %files must become COPY.
    lines = dockerfile.splitlines()
    assert not any(line.startswith("ADD ") for line in lines)
    assert "COPY runai/pod.sh /opt/ddp/runai/pod.sh" in lines


def test_an_environment_line_ch_image_cannot_build_is_refused(tmp_path):
    definition = tmp_path / "prepend.def"
    definition.write_text("Bootstrap: docker\nFrom: python:3.12-slim\n\n%environment\n"
                          '    export PYTHONPATH="/opt/x${PYTHONPATH:+:$PYTHONPATH}"\n\n%runscript\n'
                          '    exec ddp-launch "$@"\n')
    with pytest.raises(ValueError, match=r"ch-image cannot build"):
        generate(str(definition), {})
