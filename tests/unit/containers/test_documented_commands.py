"""The commands the documentation quotes agree with the code that runs them.

A reader copies these lines as they are, so a doc that drifts from the job scripts or the
image is a bug: the srun flags of the training step, `--nv` (`--rocm` for LUMI) on every run of the GPU
image, and a doctor command for a site run whole, as a reader would, with its binds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from definitions_paths import CONTAINERS, REPO

from ddp_launch.sites import load_site

DOCS = [REPO / "README.md", CONTAINERS / "README.md", CONTAINERS / "gpu.def", *sorted((REPO / "docs").glob("*.md"))]
DDP_SH = REPO / "slurm" / "lib" / "ddp.sh"
SRUN_STEP_FLAGS = re.compile(r'--kill-on-bad-exit=(\d)|--wait="?(?:\$\{DDP_STEP_WAIT:-)?(\d+)')
# `apptainer run [flags] IMAGE` (the runscript is ddp-launch) and `apptainer exec [flags] IMAGE
# ddp-launch`: the GPU images are every SIF but the CPU one. `exec IMAGE ddp-train --download`
# on a login node needs no GPU.
APPTAINER_RUN = re.compile(r"(?:apptainer|singularity) (run|exec)((?: +-[-\w=]+)*) +(\S+\.sif)(?: +(\S+))?")


def training_srun_flags() -> dict[str, str]:
    """The --kill-on-bad-exit and --wait values of ddp::train's srun (not the sampler's)."""
    text = DDP_SH.read_text()
    line = next(line for line in text.splitlines()
                if "srun --kill-on-bad-exit" in line and not line.strip().startswith("#"))
    flags = {}
    for kill, wait in SRUN_STEP_FLAGS.findall(line):
        flags.update({"kill-on-bad-exit": kill} if kill else {"wait": wait})
    return flags


def test_the_training_srun_is_what_this_test_expects_to_read():
    assert training_srun_flags() == {"kill-on-bad-exit": "0", "wait": "30"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_documented_srun_step_flags_are_the_job_scripts(doc):
    # srun(1): --kill-on-bad-exit=1 ends the step when any task exits non-zero, and "-K
    # overrides -W"; the two choices behave differently on a requeue (exit 75), so the doc
    # must say the one ddp.sh uses.
    expected = training_srun_flags()
    for kill, wait in SRUN_STEP_FLAGS.findall(doc.read_text()):
        if kill:
            assert kill == expected["kill-on-bad-exit"], f"{doc.name} quotes --kill-on-bad-exit={kill}"
        else:
            assert wait == expected["wait"], f"{doc.name} quotes --wait={wait}"


def gpu_flag(image: str) -> str:
    """The Apptainer flag of the vendor the image is for: the LUMI image runs on AMD GCDs."""
    return "--rocm" if "lumi" in image else "--nv"


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_documented_run_of_the_gpu_image_has_its_gpu_flag(doc):
    # Without --nv (NVIDIA) or --rocm (AMD) no GPU enters the container (Apptainer user guide,
    # "GPU Support": https://apptainer.org/docs/user/main/gpu.html), and inside a GPU allocation
    # the launcher refuses the granted GPUs it cannot use (exit 2).
    runs = [(flags, image) for verb, flags, image, program in APPTAINER_RUN.findall(doc.read_text())
            if "cpu" not in image and (verb == "run" or program.strip("`") == "ddp-launch")]
    missing = [f"apptainer ...{flags} {image}" for flags, image in runs if gpu_flag(image) not in flags.split()]
    assert not missing, f"{doc.name}: add the GPU flag (--nv, or --rocm for LUMI) to {missing}"


def test_the_checks_see_the_commands_they_guard():
    text = (CONTAINERS / "README.md").read_text()
    assert APPTAINER_RUN.findall(text), "no `apptainer run ... train.sif` found: the pattern drifted from the docs"
    assert SRUN_STEP_FLAGS.findall((REPO / "docs" / "troubleshooting.md").read_text())


# A doctor command for a site whose libraries are bound in from the host: a reader runs the quoted
# lines as they stand, and the container sees host paths only through the binds, which the runtime
# reads from APPTAINER_BIND (Apptainer) or SINGULARITY_BIND (SingularityCE, LUMI's), set on the host
# (their user guides, "Bind Paths and Mounts"). Without them doctor FAILs every host library.
SITE_DOCTOR = re.compile(r"(apptainer|singularity) exec[^`\n]*? ddp-launch doctor\b[^`\n]*?--site[ =](\w+)")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def site_doctor_commands() -> list[tuple[str, str, str]]:
    """(doc, the fenced block or None, the command) for every documented doctor command with --site."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        blocks = [(m.start(1), m.end(1), m.group(1)) for m in FENCED.finditer(text)]
        for match in SITE_DOCTOR.finditer(text):
            block = next((b for start, end, b in blocks if start <= match.start() < end), None)
            found.append((str(doc.relative_to(REPO)), block, match.group(0)))
    return found


def run_block(block: str, tmp_path) -> list[dict]:
    """The block run by bash from the checkout, with `python3 -m ddp_launch.binds` and the container
    runtimes stubbed: each runtime call comes back as its argv and the two bind variables it saw."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    record = tmp_path / "calls.jsonl"
    (stubs / "python3").write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "-m ddp_launch.binds --site" ] && [ "$#" = 4 ] || exit 64\n'
        'case ":$PYTHONPATH:" in *:entrypoints:* | *"/entrypoints:"*) ;; *) exit 65 ;; esac\n'
        'echo "/host/$4:/opt/$4"\n')
    for runtime in ("apptainer", "singularity"):
        (stubs / runtime).write_text(
            f'#!{sys.executable}\nimport json, os, sys\n'
            f'with open({str(record)!r}, "a") as out:\n'
            f'    json.dump({{"argv": ["{runtime}", *sys.argv[1:]], "APPTAINER_BIND": os.environ.get("APPTAINER_BIND"),'
            f' "SINGULARITY_BIND": os.environ.get("SINGULARITY_BIND")}}, out)\n    out.write("\\n")\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "REPO": str(REPO)}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.mark.parametrize("doc, block, command", site_doctor_commands(),
                         ids=[f"{doc}:{SITE_DOCTOR.search(command).group(2)}" for doc, _, command in site_doctor_commands()])
def test_a_documented_doctor_command_for_a_site_runs_as_written_with_its_binds(doc, block, command, tmp_path):
    site = SITE_DOCTOR.search(command).group(2)
    profile = load_site(site, {})
    if not profile.binds:
        return  # nothing of the host's to bind: the command alone is whole
    assert block is not None, f"{doc}: quote `{command}` in a code block with the {site} binds export before it"
    calls = run_block(block, tmp_path)
    runtime = profile.container_runtime
    doctor = [c for c in calls if "doctor" in c["argv"]]
    assert [c["argv"][:2] for c in doctor] == [[runtime, "exec"]], f"{doc}: {site} runs the image with {runtime}"
    assert doctor[0][f"{runtime.upper()}_BIND"] == f"/host/{site}:/opt/{site}", \
        f"{doc}: export {runtime.upper()}_BIND=\"$(python3 -m ddp_launch.binds --site {site})\" before `{command}`"


def test_the_documented_doctor_commands_are_found():
    sites = {SITE_DOCTOR.search(command).group(2) for _, _, command in site_doctor_commands()}
    assert {"olivia", "lumi"} <= sites
