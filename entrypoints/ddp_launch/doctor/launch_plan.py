"""The doctor's first check: what `ddp-launch` would do on this node, from the launcher's own
planner (ctx.launch); its one-line refusal is the finding."""

from __future__ import annotations

from ddp_launch.doctor.context import DoctorContext
from ddp_launch.doctor.report import FAIL, OK, Check


def check_launch_plan(ctx: DoctorContext) -> Check:
    """What `ddp-launch` would do here, from the same planner; its refusal is the finding."""
    if ctx.launch is None:
        return Check("launch plan", FAIL, ctx.plan_problem or "no plan",
                     "fix what the message names; `ddp-launch --dry-run` shows the same")
    where = ""
    if ctx.launch.rendezvous is not None:
        port = ctx.launch.rendezvous.port
        where = f", rendezvous {ctx.launch.rendezvous.host}" + (f":{port}" if port is not None else "")
    return Check("launch plan", OK, f"{ctx.launch.mode} on {ctx.launch.nodes} node(s){where}")
