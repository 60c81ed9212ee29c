"""The known-issues check: the rows of containers/sites/known-issues (and a user's files) matched against
what this node's workers will load (stack.py). A match is one line each: FAIL before training for a
known hang, crash or data corruption, with the fix; WARN for a slowdown, or where the row's condition is
the workload's, which no version shows. The preflight's verdict (ddp_contract.quarantine) stops a job
whose every node FAILs one in one line with its fix, and prints the WARNs."""

from __future__ import annotations

from typing import Tuple

from ddp_contract import known_issues
from ddp_contract.errors import LaunchError
from ddp_launch.doctor.context import DoctorContext
from ddp_launch.doctor.report import FAIL, OK, Check
from ddp_launch.doctor.stack import node_stack

NAME = known_issues.CHECK_NAME


def check_known_issues(ctx: DoctorContext) -> Tuple[Check, ...]:
    try:
        rows = known_issues.load_rows(ctx.env, ctx.known_issue_files)
    except LaunchError as error:
        return (Check(NAME, FAIL, str(error),
                      f"fix the file, or leave it out ({known_issues.USER_FILES_VAR}, --known-issues)"),)
    stack = node_stack(ctx)
    if ctx.launch is not None:
        stack = known_issues.Stack({**stack.versions, "nodes": str(ctx.launch.nodes)}, stack.where, stack.settings)
    found = known_issues.matches(rows, stack)
    if not found:
        return (Check(NAME, OK, f"none of {len(rows)} known problem(s) matches: {known_issues.describe(stack)}"),)
    return tuple(Check(known_issues.check_name(m.row.id), m.verdict, m.line(), m.row.fix) for m in found)
