"""The Olivia job scripts against the Sigma2 "PyTorch on Olivia" guide: a script that runs the guide's
recipe uses the guide's values for its GPU count; one that does not names the recipe it runs and states
the peak LR it trains at, which must be what the trainer computes (ddp_train.resolve.peak_lr), and the
guide's command for its GPU count where the guide has a run on that many GPUs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ddp_train.config import config_from_args
from ddp_train.resolve import peak_lr

REPO = Path(__file__).resolve().parents[3]
OLIVIA_SCRIPTS = sorted(REPO.glob("slurm/olivia-*.sh"))

# The guide's runs, global batch and --base-lr by GPU count; its train_ddp.py passes --base-lr to SGD
# unscaled (--recipe guide, ddp_train.config.GUIDE_RECIPE).
# 4 GPUs: PyTorchMultiGpu.html, "train_ddp.py --batch-size 1024 --epochs 100 --base-lr 0.04
#   --target-accuracy 0.95 --patience 2" (https://documentation.sigma2.no/code_development/guides/pytorch_olivia/PyTorchMultiGpu.html)
# 8 GPUs (2 nodes): PyTorchMultiNode.html, "train_ddp.py --epochs 100 --batch-size 2048 --base-lr 0.04
#   --target-accuracy 0.95 --patience 2" (https://documentation.sigma2.no/code_development/guides/pytorch_olivia/PyTorchMultiNode.html)
GUIDE_RUNS = {4: (1024, 0.04), 8: (2048, 0.04)}
GUIDE_FLAGS = {"--epochs": "100", "--target-accuracy": "0.95", "--patience": "2"}


def sbatch_value(text: str, option: str) -> int:
    return int(re.search(rf"^#SBATCH --{option}=(\d+)$", text, re.M).group(1))


def train_args(text: str) -> list[str]:
    return shlex.split(re.search(r'^ddp::trainer_defaults "(.*)"$', text, re.M).group(1))


def gpus(text: str) -> int:
    return sbatch_value(text, "nodes") * sbatch_value(text, "gpus-per-node")


def test_the_olivia_scripts_are_the_three_the_guide_has():
    assert [p.name for p in OLIVIA_SCRIPTS] == ["olivia-1gpu.sh", "olivia-1node-4gpu.sh", "olivia-multinode.sh"]
    assert [gpus(p.read_text()) for p in OLIVIA_SCRIPTS] == [1, 4, 8]


@pytest.mark.parametrize("script", OLIVIA_SCRIPTS, ids=lambda p: p.name)
def test_each_olivia_script_runs_the_guides_values_or_says_which_recipe_and_peak_lr_it_runs(script):
    text = script.read_text()
    args = train_args(text)
    config = config_from_args(args)
    world = gpus(text)
    flags = dict(zip(args, args[1:]))
    assert {k: flags.get(k) for k in GUIDE_FLAGS} == GUIDE_FLAGS  # the guide's stopping rule, in every script
    if config.recipe == "guide":
        assert (config.batch_size, peak_lr(config, world)) == GUIDE_RUNS[world], script.name
        return
    # Not the guide's recipe: named on the command line, and the header says so with the peak LR.
    assert flags.get("--recipe") == config.recipe, f"{script.name}: name the recipe in DDP_TRAIN_ARGS"
    header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("# "))
    assert f"Recipe: the {config.recipe} one (--recipe {config.recipe}" in header, script.name
    stated = re.search(r"peak LR ([\d.]+) at batch (\d+)", header)
    assert stated, f"{script.name}: state the peak LR the script trains at"
    assert (float(stated.group(1)), int(stated.group(2))) == (pytest.approx(peak_lr(config, world)), config.batch_size)
    if world in GUIDE_RUNS:
        batch, lr = GUIDE_RUNS[world]
        assert f"--recipe guide --batch-size {batch} --base-lr {lr}" in header, script.name
        # ... and the command that runs it: the script's own flags, the guide's recipe and LR after them.
        command = re.search(rf"^# .*sbatch slurm/{re.escape(script.name)} (--recipe guide .*)$", text, re.M).group(1).split()
        guided = config_from_args(args + command)
        assert (guided.recipe, guided.batch_size, peak_lr(guided, world)) == ("guide", batch, lr)
