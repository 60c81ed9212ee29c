"""`ddp-launch doctor` on head names no resolver takes: a FAIL line from the planner, not an IDNA traceback."""

from __future__ import annotations

import io
import json

import pytest

from ddp_launch.doctor import Probes, run


def never(*args):
    raise AssertionError("a name that cannot be looked up must not be connected to")


@pytest.mark.parametrize("head, problem", [
    ("n" * 64 + ".cluster", "64 characters, over DNS's 63"),
    ("node\udcff1", "bytes that are not UTF-8"),
    ("a..b", "empty label"),
])
def test_a_head_name_no_resolver_takes_fails_the_check_in_one_line(tmp_path, head, problem):
    out = io.StringIO()
    env = {"PET_NNODES": "2", "RANK": "1", "MASTER_ADDR": head, "MASTER_PORT": "29500"}
    probes = Probes(lambda: None, never, never, never, lambda name: None, never)

    code = run(["--root", str(tmp_path), "--json"], env, out, probes)

    checks = {c["name"]: c for c in json.loads(out.getvalue())["checks"]}
    assert code == 1 and checks["launch plan"]["status"] == "FAIL"
    assert problem in checks["launch plan"]["detail"] and "MASTER_ADDR" in checks["launch plan"]["detail"]
    assert "\n" not in checks["launch plan"]["detail"]
    assert checks["head node"]["status"] == "SKIP"
