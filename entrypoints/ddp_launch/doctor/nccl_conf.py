"""The NCCL config files check: what /etc/nccl.conf, ~/.nccl.conf and $NCCL_CONF_FILE set for this job's
NCCL (ddp_contract.nccl_conf has NCCL's rules), and every line at odds with the launch plan: a value
the site profile or the fabric defaults set otherwise, a variable the site leaves unset on purpose, a
name NCCL never reads, an NCCL_CONF_FILE this NCCL ignores or that names no file."""

from __future__ import annotations

from typing import List

from ddp_contract import nccl_conf
from ddp_launch.doctor.context import DoctorContext
from ddp_launch.doctor.report import OK, WARN, Check
from ddp_launch.doctor.stack import collective, workers_env
from ddp_launch.plan import LAUNCHER

NAME = "nccl config files"
FIX = ("edit or remove the line: NCCL reads these files in every process it starts, outside ddp-launch too "
       "(Apptainer binds $HOME, so ~/.nccl.conf reaches every image)")


def check_nccl_conf(ctx: DoctorContext) -> Check:
    env = workers_env(ctx)
    version, _ = collective(ctx)
    collective_name = f"{ctx.accelerator.collective} {version}" if version else ctx.accelerator.collective
    files = nccl_conf.read_files(nccl_conf.files_nccl_reads(env, version), ctx.root)
    lines = nccl_conf.lines_of(files, env)
    problems: List[str] = []
    chosen = env.get(nccl_conf.CONF_FILE_VAR, "")
    if chosen and not nccl_conf.reads_conf_file_var(version):
        problems.append(f"{nccl_conf.CONF_FILE_VAR}={chosen} is ignored by {collective_name} (read since 2.23, "
                        f"NCCL's env.rst): it reads ~/{nccl_conf.USER_FILE} instead")
    elif chosen and files[0].text is None:
        problems.append(f"{nccl_conf.CONF_FILE_VAR}={chosen} names no readable file, so {collective_name} reads "
                        f"nothing from it, nor ~/{nccl_conf.USER_FILE}")
    planned = {c.name: c for c in (ctx.launch.changes if ctx.launch else ctx.fabric.changes) if c.origin != LAUNCHER}
    withheld = {item.name: item.source for item in (ctx.profile.env if ctx.profile else ()) if item.value is None}
    listed = []
    for line in lines:
        setting = f"{line.where}: {line.name}={line.value}"
        if line.effect == nccl_conf.NEVER_READ:
            problems.append(f"{line.where}: {line.text!r} is {line.effect}")
        elif line.name in withheld:
            problems.append(f"{setting} ({line.effect}) goes against site {ctx.profile.name}, which leaves it unset: "
                            f"{withheld[line.name]}")
        elif line.name in planned and planned[line.name].value != line.value:
            change = planned[line.name]
            problems.append(f"{setting} conflicts with the {change.origin}'s {line.name}={change.value} "
                            f"({change.reason}); in this job the environment's value wins, NCCL run without "
                            f"ddp-launch takes the file's")
        else:
            listed.append(f"{setting} ({line.effect})")
    if problems:
        return Check(NAME, WARN, "; ".join(problems + listed), FIX)
    if listed:
        return Check(NAME, OK, "; ".join(listed))
    looked = ", ".join(nccl_conf.describe_file(conf.path, conf.why) for conf in files)
    present = [conf for conf in files if conf.text is not None]
    if present:
        return Check(NAME, OK, f"no setting in {', '.join(conf.path for conf in present)} (NCCL reads {looked})")
    return Check(NAME, OK, f"none: NCCL looks for {looked}")
