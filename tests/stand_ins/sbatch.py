"""sbatch: a job script submitted as sbatch(1) takes it, checked as our scripts will run it, never run.

sbatch(1) (https://slurm.schedmd.com/sbatch.html): options before the script, the script's own
arguments after it; "#SBATCH" directives are read "before any executable commands in the script",
and an option sbatch does not know, on the command line or in a directive, ends the submission.
"Submitted batch job <id>" is its answer. Beyond that, what the job would refuse in its first
seconds: a DDP_* variable that no script, library, launcher or trainer reads (a typo the job would
ignore), and trainer or ddp-launch flags that ddp-train or ddp-launch refuse.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from record import record, refuse

REPO = Path(__file__).resolve().parents[2]
# sbatch(1)'s long options that the docs and the job scripts use, value or not, with their short
# forms. Any other is refused, as sbatch refuses an option it does not know.
VALUE_OPTIONS = {"account": "A", "array": "a", "constraint": "C", "cpus-per-task": "c", "dependency": "d",
                 "error": "e", "exclude": "x", "export": None, "gpus": "G", "gpus-per-node": None, "gres": None,
                 "job-name": "J", "mem": None, "mem-per-gpu": None, "nodelist": "w", "nodes": "N", "ntasks": "n",
                 "ntasks-per-node": None, "open-mode": None, "output": "o", "partition": "p", "qos": "q",
                 "reservation": None, "signal": None, "time": "t"}
FLAG_OPTIONS = {"exclusive", "hold", "no-kill", "no-requeue", "parsable", "requeue", "test-only"}
SHORT = {short: name for name, short in VALUE_OPTIONS.items() if short}
DIRECTIVES_END = re.compile(r"^\s*[^#\s]")


def parse_options(words: list, where: str) -> tuple:
    """({option: value}, the words after the options): the options as sbatch reads them."""
    options, i = {}, 0
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        if word.startswith("--"):
            name, has_value, value = word[2:].partition("=")
        elif word[1:2] in SHORT:
            name, has_value, value = SHORT[word[1:2]], bool(word[2:]), word[2:]
        else:
            refuse(f"sbatch: invalid option -- '{word[1:]}' ({where})")
        if name in FLAG_OPTIONS and not has_value:
            options[name] = ""
        elif name in VALUE_OPTIONS:
            if not has_value:
                i += 1
                if i == len(words):
                    refuse(f"sbatch: option '--{name}' requires an argument ({where})")
                value = words[i]
            options[name] = value
        else:
            refuse(f"sbatch: unrecognized option '{word}' ({where})")
        i += 1
    return options, words[i:]


def directives(script: Path) -> dict:
    """The script's #SBATCH options, read until its first command."""
    words = []
    for line in script.read_text().splitlines()[1:]:
        if DIRECTIVES_END.match(line):
            break
        if line.startswith("#SBATCH "):
            words += line[len("#SBATCH "):].split()
    options, rest = parse_options(words, f"#SBATCH in {script}")
    if rest:
        refuse(f"sbatch: error: {script}: #SBATCH {' '.join(rest)} is not an option")
    return options


def read_names() -> set:
    """Every DDP_* name the job scripts, their library, the launcher and the trainer read."""
    names = set()
    for tree in ("slurm", "entrypoints", "src"):
        for path in (REPO / tree).rglob("*"):
            if path.is_file() and path.suffix in (".sh", ".py", ""):
                names |= set(re.findall(r"\bDDP_[A-Z0-9_]+\b", path.read_text(errors="replace")))
    return names


def script_default(script: Path) -> str:
    """The built-in trainer's flags `ddp::trainer_defaults "..."` gives in script, or ""."""
    found = re.search(r'^ddp::trainer_defaults "(.*)"$', script.read_text(), re.M)
    return found.group(1) if found else ""


def check_flags(script: Path, job_args: list) -> None:
    """ddp-launch and the workload take what the job would give them (slurm/lib/ddp.sh: the words of
    DDP_LAUNCH_ARGS; the workload read from them and the job's arguments, ddp_contract.workload_choice; for
    the built-in trainer the words of DDP_TRAIN_ARGS, else the script's defaults, then its arguments, which
    ddp-train must take; a script of the user's must be a readable file from here, the submit directory)."""
    from ddp_contract.shell_words import split_words
    from ddp_contract.workload_choice import choose, with_absolute_script
    from ddp_launch.options import read_options
    from ddp_train.config import config_from_args
    try:
        launch_words = split_words("DDP_LAUNCH_ARGS", os.environ.get("DDP_LAUNCH_ARGS", ""))
        choice = with_absolute_script(choose(launch_words, job_args), os.getcwd(), os.environ)
        read_options([*choice.launch_words, *choice.launch_flags(), "--"], {})
        if choice.is_builtin:
            train_words = split_words("DDP_TRAIN_ARGS", os.environ.get("DDP_TRAIN_ARGS", script_default(script)))
            config_from_args([*train_words, *choice.args])
    except (Exception, SystemExit) as error:
        refuse(f"sbatch stand-in: {script} would stop: {error}", 2)


def main() -> None:
    options, rest = parse_options(sys.argv[1:], "the command line")
    if not rest:
        refuse("sbatch: error: Batch job submission failed: no batch script (sbatch reads one from stdin, "
               "which the docs never use)")
    script, trainer_args = Path(rest[0]), rest[1:]
    if not script.is_file():
        refuse(f"sbatch: error: Unable to open file {script}")
    if not script.read_text().startswith("#!"):
        refuse("sbatch: error: This does not look like a batch script.  The first line must start with #! "
               "followed by the path to an interpreter.")
    script_options = directives(script)
    given = {name: value for name, value in os.environ.items() if name.startswith("DDP_")}
    unread = sorted(set(given) - read_names())
    if unread:
        refuse(f"sbatch stand-in: {', '.join(unread)} is read by no job script, library, launcher or trainer", 2)
    check_flags(script, trainer_args)
    record("sbatch", sys.argv[1:], script=str(script), options=options, directives=script_options,
           args=trainer_args, env=given)
    print("Submitted batch job 4242")


main()
