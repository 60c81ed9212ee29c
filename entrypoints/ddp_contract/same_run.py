"""Which flags a checkpoint binds its run to, and the one that may change on a resume: --epochs, longer.

A resume continues the run the checkpoint holds. The flags that make it that run cannot change:
the model's shape (--width-scale), the optimizer steps and the order of the data in them
(--batch-size, --seed) and the recipe. --epochs may grow: the run trains on to the new end, its
learning rate following the schedule of a run planned for the new number of epochs from the start
(src/ddp_train/recipe/learner.py, lr_at, with the new total), and early stopping judges every
epoch's accuracy under the flags of this start. It may not shrink: the steps already taken were
scheduled for the longer run.

The trainer applies the rule on every resume (src/ddp_train/checkpoint.py), from the checkpoint
itself. Tools without torch apply it before anything starts, from the checkpoint's summary beside it
(SUMMARY_NAME, which the trainer writes after each checkpoint): the job scripts on the batch host
(slurm/lib/ddp.sh) and runai/submit.sh where the run's claim is mounted on the submitting machine,
both through `python3 -m ddp_contract resume-check RUN_DIR -- TRAINER_FLAGS...`. They judge the flags
given on that command line only (a flag left to its default is the trainer's to judge), and a
summary one save behind its checkpoint only lets through what the trainer then refuses, never the
other way round.

Python 3.6, standard library: the job scripts run it with the node's python3.
"""

import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

# The flags a resumed run must share with its checkpoint, and each one's type on the command line.
FIXED_FLAGS = {"width_scale": float, "batch_size": int, "seed": int, "recipe": str}
# The flag a resume may raise, never lower.
LONGER_FLAG = "epochs"
# Beside checkpoint.pt: the flags above and where the run stands, for tools without torch.
SUMMARY_NAME = "checkpoint.json"
# The rules as the run's metrics record them (metrics.jsonl, the "extended" record) and the docs say them.
LR_RULE = ("the learning rate at each step is the schedule's for a run of the new --epochs from the start: "
           "the steps left follow that run's warm-up and decay, from the step reached")
EARLY_STOP_RULE = ("early stopping judges every epoch's accuracy, those before the resume included, with "
                   "this start's --target-accuracy and --patience: a run that stopped early trains on only "
                   "where its last epochs no longer reach them")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def refusal(saved: Mapping[str, Any], given: Mapping[str, Any], checkpoint: str, ways_out: str) -> Optional[str]:
    """Why a run with the flags `given` cannot resume the checkpoint whose flags are `saved` (one line
    ending in ways_out, the fixes where the caller runs), or None. Flags absent from `given` are not judged."""
    for name in FIXED_FLAGS:
        if name in given and saved.get(name) != given[name]:
            return ("{} was written with {} {}, this run has {}: use the same value, {}"
                    .format(checkpoint, flag(name), saved.get(name), given[name], ways_out))
    if LONGER_FLAG in given and isinstance(saved.get(LONGER_FLAG), int) and given[LONGER_FLAG] < saved[LONGER_FLAG]:
        return ("{} is a run of --epochs {}, this run has {}: a resume may train longer, never shorter (the "
                "steps taken were scheduled for {} epochs); pass --epochs {} or more, {}"
                .format(checkpoint, saved[LONGER_FLAG], given[LONGER_FLAG], saved[LONGER_FLAG],
                        saved[LONGER_FLAG], ways_out))
    return None


def summary(config: Mapping[str, Any], progress: Mapping[str, Any]) -> Dict[str, Any]:
    """What SUMMARY_NAME holds: the checkpoint's binding flags and where its run stands."""
    return {"config": {name: config.get(name) for name in (*FIXED_FLAGS, LONGER_FLAG)},
            "epoch": progress.get("epoch"), "step": progress.get("step"),
            "finished": progress.get("finished"), "early_stopped": progress.get("early_stopped")}


def given_flags(words: List[str]) -> Dict[str, Any]:
    """The binding flags among trainer flags as a command line gives them (--name VALUE or --name=VALUE;
    the last one wins, as argparse's), each of its type; a value that does not parse is left to the trainer."""
    wanted = dict(FIXED_FLAGS, **{LONGER_FLAG: int})
    found = {}  # type: Dict[str, Any]
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if not name.startswith("--"):
            continue
        key = name[2:].replace("-", "_")
        if key not in wanted:
            continue
        if not equals:
            if index + 1 >= len(words):
                continue
            value = words[index + 1]
        try:
            found[key] = wanted[key](value)
        except ValueError:
            found.pop(key, None)
    return found


def main(args: List[str]) -> int:
    """resume-check RUN_DIR [--tag TAG] [--ways-out TEXT] -- TRAINER_FLAGS...: exit 2 with one line,
    "TAG: error: ...", ending in the ways out where the caller runs (TEXT, its {run_dir} the run dir),
    when the run's checkpoint cannot be resumed with those flags; 0 when it can, when the flags start
    afresh (--no-resume), or when RUN_DIR holds no summary (no checkpoint yet)."""
    usage = "usage: python3 -m ddp_contract resume-check RUN_DIR [--tag TAG] [--ways-out TEXT] -- TRAINER_FLAGS..."
    if "--" not in args:
        print(usage, file=sys.stderr)
        return 2
    cut = args.index("--")
    head, words = args[:cut], args[cut + 1:]
    options = {"--tag": "ddp", "--ways-out": "or --no-resume (which keeps this run, moved aside into "
                                            "{run_dir}/checkpoint-<UTC time>/)"}
    rest = head[1:]
    while len(rest) >= 2 and rest[0] in options:
        options[rest[0]] = rest[1]
        rest = rest[2:]
    if len(head) < 1 or rest:
        print(usage, file=sys.stderr)
        return 2
    run_dir = head[0]
    switches = [word for word in words if word in ("--resume", "--no-resume")]
    if switches[-1:] == ["--no-resume"]:
        return 0  # a fresh run: the trainer moves this one aside
    path = os.path.join(run_dir, SUMMARY_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)["config"]
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # unreadable: the trainer reads the checkpoint itself and says what is wrong
    checkpoint = os.path.join(run_dir, "checkpoint.pt")
    problem = refusal(saved, given_flags(words), checkpoint, options["--ways-out"].replace("{run_dir}", run_dir))
    if problem:
        print("{}: error: {}".format(options["--tag"], problem), file=sys.stderr)
        return 2
    return 0
