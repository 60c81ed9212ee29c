"""`python3 -m ddp_contract.shell_words PROG NAME VALUE`: the one splitter of the settings that hold
words (DDP_TRAIN_ARGS, DDP_LAUNCH_ARGS, RUNAI_EXTRA_ARGS). The rule is the POSIX shell's quoting
with no expansion (POSIX sh, 2.2 "Quoting"), as Python's shlex.split in POSIX mode implements it;
the job scripts' own runs of it are in tests/bats (job_scripts.bats, runai.bats)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddp_contract.shell_words import split_words

ENTRYPOINTS = Path(__file__).resolve().parents[3] / "entrypoints"

WORDS = {
    "plain words": ("--epochs 5", ["--epochs", "5"]),
    "single quotes keep spaces": ("--note 'two words'", ["--note", "two words"]),
    "double quotes keep spaces, nothing is expanded": ('--tag "$HOME" --glob *', ["--tag", "$HOME", "--glob", "*"]),
    "a backslash escapes": (r"a\ b", ["a b"]),
    "an empty quoted word stays a word": ("--note ''", ["--note", ""]),
}


@pytest.mark.parametrize("value, words", WORDS.values(), ids=WORDS.keys())
def test_words_follow_the_shells_quoting(value, words):
    assert split_words("DDP_TRAIN_ARGS", value) == words


def run(*args: str | bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddp_contract.shell_words", *args], cwd=ENTRYPOINTS,
                          capture_output=True, timeout=60)


def test_words_come_back_nul_terminated_then_one_empty_word():
    done = run("ddp", "DDP_TRAIN_ARGS", "--note 'two words' ''")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"--note\0two words\0\0\0", b"")


def test_bytes_that_are_not_utf_8_come_back_unchanged():
    done = run("ddp", "DDP_TRAIN_ARGS", b"--run-dir /scratch/caf\xe9")
    assert (done.returncode, done.stdout) == (0, b"--run-dir\0/scratch/caf\xe9\0\0")


def test_an_unclosed_quote_is_one_line_under_the_callers_name_exit_2_and_no_words():
    done = run("runai/submit.sh", "RUNAI_EXTRA_ARGS", "-e 'NOTE=x")
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode() == ("runai/submit.sh: error: RUNAI_EXTRA_ARGS=\"-e 'NOTE=x\" is not words of the "
                                    "shell (No closing quotation): close each quote as in the shell, e.g. \"a b\"\n")
