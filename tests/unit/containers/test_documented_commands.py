"""The commands the documentation quotes agree with the code that runs them.

A reader copies these lines as they are, so a doc that drifts from the job scripts or the
image is a bug: the srun flags of the training step, and `--nv` (`--rocm` for LUMI) on every run of the GPU image.
"""

from __future__ import annotations

import re

import pytest
from definitions_paths import CONTAINERS, REPO

DOCS = [REPO / "README.md", CONTAINERS / "README.md", CONTAINERS / "gpu.def", *sorted((REPO / "docs").glob("*.md"))]
DDP_SH = REPO / "slurm" / "lib" / "ddp.sh"
SRUN_STEP_FLAGS = re.compile(r'--kill-on-bad-exit=(\d)|--wait="?(?:\$\{DDP_STEP_WAIT:-)?(\d+)')
# `apptainer run [flags] IMAGE` (the runscript is ddp-launch) and `apptainer exec [flags] IMAGE
# ddp-launch`: the GPU images are every SIF but the CPU one. `exec IMAGE ddp-train --download`
# on a login node needs no GPU.
APPTAINER_RUN = re.compile(r"apptainer (run|exec)((?: +-[-\w=]+)*) +(\S+\.sif)(?: +(\S+))?")


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
