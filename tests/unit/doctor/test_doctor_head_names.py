"""`ddp-launch doctor`'s head check on names no resolver takes: a FAIL line, not an IDNA traceback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddp_launch.doctor_checks import FAIL, check_head_node


def never_connect(address, port, timeout):
    raise AssertionError("a name that cannot be looked up must not be connected to")


@pytest.mark.parametrize("head, problem", [
    ("n" * 64 + ".cluster", "64 characters, over DNS's 63"),
    ("node\udcff1", "bytes that are not UTF-8"),
    ("a..b", "empty label"),
])
def test_a_head_name_no_resolver_takes_fails_the_check_in_one_line(head, problem):
    ctx = SimpleNamespace(offline=False, env={"MASTER_ADDR": head, "MASTER_PORT": "29500"},
                          probes=SimpleNamespace(connect=never_connect))
    check = check_head_node(ctx)
    assert check.status == FAIL
    assert problem in check.detail and "\n" not in check.detail
    assert "--rdzv-host" in check.fix
