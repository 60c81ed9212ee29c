"""--dry-run text of the reference setups' plans against recorded files: any change shows as a line diff."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from launch_envs import olivia, plan_for, raven, runai

GOLDEN = Path(__file__).parent / "golden"

CASES = {
    "olivia_head": (olivia(0), ("--", "--epochs", "100", "--batch-size", "2048")),
    "olivia_worker": (olivia(1), ()),
    "raven_task5": (raven(5), ("--", "--batch-size", "256")),
    "runai_worker": (runai(1), ()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_text_matches_the_recorded_plan(name):
    env, argv = CASES[name]
    text = plan_for(env, *argv).render_text() + "\n"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    expected = path.read_text() if path.exists() else ""
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(path), "this run"))
        pytest.fail(f"--dry-run plan changed:\n{diff}\nIf the change is intended, accept it with:\n"
                    f"  UPDATE_GOLDEN=1 python -m pytest {os.path.relpath(__file__)}",
                    pytrace=False)
