"""Which workload a launch runs: the built-in trainer, or the user's own script or module, and its arguments.

Every path to a launch reads it here, once, from the same words: a SLURM job script's arguments and
DDP_LAUNCH_ARGS (slurm/lib/ddp.sh), a pod's arguments (runai/pod.sh, as runai/submit.sh and the
Kubeflow manifest pass them), the sbatch stand-in of the tests. The workload is named first:

    --script PATH [ARGS ...]    the user's Python file, with exactly ARGS
    --module MOD [ARGS ...]     python -m MOD, with exactly ARGS
    [ARGS ...]                  the built-in trainer (python -m ddp_train), ARGS its flags

or in DDP_LAUNCH_ARGS (`DDP_LAUNCH_ARGS="--script train.py"`), where the arguments are then all
the workload's. Its steps read the choice, not the words: the preflight checks what the workload
needs, the fabric gate runs our own module whatever it is, the training step runs it (ddp-launch
--script/--module), and only the built-in trainer gets the job script's default flags and the
CIFAR-100 check.

`python3 -m ddp_contract.workload_choice [--check-file] PROG N LAUNCH_WORD... ARG...` prints the
choice, each field NUL-terminated: the kind, the target (the script's absolute path, the module, or
"" for the built-in trainer), the count of launch words left, those words, the workload's arguments,
then one empty word that says it succeeded (as ddp_contract.shell_words does, for bash 4.4). A bad
choice is one line `PROG: error: ...` on stderr, exit 2. --check-file: the script must be a readable
file here (a job's node, a pod), and a relative path is made absolute from here.
Python 3.6, standard library: the job scripts run it with the node's python3 (host-modules.txt).
"""

import os
import sys
from typing import NamedTuple, Optional, Sequence, Tuple

from ddp_contract import EXIT_USAGE
from ddp_contract.errors import LaunchError
from ddp_contract.place import SCRIPT_IN_A_POD, in_a_pod

BUILTIN, SCRIPT, MODULE = "builtin", "script", "module"
FLAGS = {"--script": SCRIPT, "--module": MODULE}
# The built-in trainer's module: `--module ddp_train` names it too.
TRAINER_MODULE = "ddp_train"


class Choice(NamedTuple):
    kind: str                       # BUILTIN, SCRIPT or MODULE
    target: str                     # the script's path or the module's name; "" for the built-in trainer
    launch_words: Tuple[str, ...]   # DDP_LAUNCH_ARGS's words without the workload's
    args: Tuple[str, ...]           # the workload's own arguments

    @property
    def is_builtin(self) -> bool:
        return self.kind == BUILTIN

    def launch_flags(self) -> Tuple[str, ...]:
        """ddp-launch's flags that name this workload (none for the built-in trainer, its default)."""
        return () if self.is_builtin else ("--" + self.kind, self.target)


def _flag_at(words: Sequence[str], index: int) -> Optional[Tuple[str, str, int]]:
    """(kind, value, words taken) when words[index] names a workload, else None."""
    word = words[index]
    for flag, kind in FLAGS.items():
        if word == flag:
            if index + 1 >= len(words) or not words[index + 1]:
                raise LaunchError("{} needs a value: {} PATH for your script, {} MOD for a module".format(
                    flag, "--script", "--module"))
            return kind, words[index + 1], 2
        if word.startswith(flag + "="):
            value = word[len(flag) + 1:]
            if not value:
                raise LaunchError("{} is empty: give {} a value".format(word, flag))
            return kind, value, 1
    return None


def _from_launch_words(words: Sequence[str]) -> Tuple[Optional[Tuple[str, str, str]], Tuple[str, ...]]:
    """(the workload DDP_LAUNCH_ARGS names, as (kind, value, how it was written); its other words)."""
    found, kept, i = [], [], 0
    while i < len(words):
        named = _flag_at(words, i)
        if named is None:
            kept.append(words[i])
            i += 1
            continue
        kind, value, taken = named
        found.append((kind, value, " ".join(words[i:i + taken])))
        i += taken
    if len(found) > 1:
        raise LaunchError("DDP_LAUNCH_ARGS names {} workloads ({}): give one, --script PATH or --module MOD".format(
            len(found), ", ".join(written for _, _, written in found)))
    return (found[0] if found else None), tuple(kept)


def choose(launch_words: Sequence[str], job_args: Sequence[str]) -> Choice:
    """The workload from DDP_LAUNCH_ARGS's words and the job's (or pod's) arguments; a LaunchError
    names a workload named twice (both in DDP_LAUNCH_ARGS, or there and in the arguments), or after
    other arguments. Once named, every later word is the workload's own, --module or --script too."""
    in_launch, kept = _from_launch_words(launch_words)
    in_args = _flag_at(job_args, 0) if job_args else None
    if in_launch is not None and in_args is not None:
        raise LaunchError("the workload is named twice, in DDP_LAUNCH_ARGS ({}) and in the arguments ({} {}): "
                          "name it once, as the first arguments (--script PATH ARGS...)".format(
                              in_launch[2], "--" + in_args[0], in_args[1]))
    if in_args is not None:
        kind, target, taken = in_args
        args = tuple(job_args[taken:])
    elif in_launch is not None:
        kind, target, _ = in_launch
        args = tuple(job_args)
    else:
        late = next((word for word in job_args if word.split("=", 1)[0] in FLAGS), None)
        if late is not None:  # the trainer has no such flag: a workload named after other arguments
            raise LaunchError("{} comes after other arguments ({}): name the workload first, as --script PATH "
                              "ARGS... (the arguments after it are all the workload's)".format(
                                  late, " ".join(job_args[:job_args.index(late)])))
        return Choice(BUILTIN, "", kept, tuple(job_args))
    if kind == MODULE and target == TRAINER_MODULE:
        return Choice(BUILTIN, "", kept, args)
    return Choice(kind, target, kept, args)


def script_problem(path: str, cwd: str, env) -> Optional[str]:
    """Why the script at path cannot run from here, with the fix; None when it is a readable file."""
    full = os.path.join(cwd, path)
    if os.path.isfile(full):
        if os.access(full, os.R_OK):
            return None
        return "--script {} is not readable by you (uid {}): make it readable (chmod u+r {})".format(
            path, os.getuid(), full)
    if in_a_pod(env):
        where = SCRIPT_IN_A_POD
    else:
        where = ("give the path of your training script, relative to the directory you submit from or "
                 "absolute")
    return "--script {} is not a file on {} ({}): {}".format(path, _host(), full, where)


def _host() -> str:
    return os.uname()[1].split(".")[0] or "this node"


def with_absolute_script(choice: Choice, cwd: str, env) -> Choice:
    """The choice with its script checked here and its path made absolute, so every node and step runs
    the same file whatever their working directory (LaunchError: not a readable file here)."""
    if choice.kind != SCRIPT:
        return choice
    problem = script_problem(choice.target, cwd, env)
    if problem:
        raise LaunchError(problem)
    return choice._replace(target=os.path.normpath(os.path.join(cwd, choice.target)))


def encode(choice: Choice) -> bytes:
    fields = [choice.kind, choice.target, str(len(choice.launch_words)), *choice.launch_words, *choice.args]
    return b"".join(os.fsencode(field) + b"\0" for field in fields) + b"\0"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check_file = args[:1] == ["--check-file"]
    if check_file:
        args = args[1:]
    if len(args) < 2 or not args[1].isdigit() or len(args) < 2 + int(args[1]):
        print("usage: python3 -m ddp_contract.workload_choice [--check-file] PROG N LAUNCH_WORD... ARG...",
              file=sys.stderr)
        return EXIT_USAGE
    prog, count = args[0], int(args[1])
    launch_words, job_args = args[2:2 + count], args[2 + count:]
    try:
        choice = choose(launch_words, job_args)
        if check_file:
            choice = with_absolute_script(choice, os.getcwd(), os.environ)
    except LaunchError as error:
        print("{}: error: {}".format(prog, error), file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    sys.stdout.buffer.write(encode(choice))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
