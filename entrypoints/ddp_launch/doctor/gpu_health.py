"""GPU health for the preflight: the vendor's tool read into records, judged by the accelerator data.

The tool (nvidia-smi -q -x, amd-smi --json), the fields that mean a sick GPU and where each rule
comes from (NHC, DCGM) are in containers/sites/accelerators/<vendor>.json; here are the readers
for the two output formats and the judgement, pure: the doctor runs the commands (its probes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from xml.etree import ElementTree

from ddp_contract import HARDWARE_CHECKS
from ddp_launch.accelerators import Accelerator, Health
from ddp_launch.gpus import GpuGrant

NAME = HARDWARE_CHECKS[0]
# What nvidia-smi and amd-smi print for a value the GPU does not report (nvidia-smi(1), -q: "Any
# unsupported data is indicated by a N/A"); a field the GPU does not report is never a failure.
NOT_REPORTED = {"", "n/a", "not supported", "[not supported]", "requested functionality has been deprecated"}
_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)(?:\s|$)")
TEMPERATURE = "temperature over its slowdown limit"
FIX = ("drain this node: its GPUs are not fit to train on (in a job the preflight excludes it and requeues, "
       "runs/<job>/quarantine.json); a GPU reset applies pending retirements and remaps, the rest needs repair")


@dataclass(frozen=True)
class CommandOutput:
    argv: tuple[str, ...]
    code: int               # the exit status; 127 when it could not be started, 124 when it timed out
    stdout: str
    stderr: str

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    def first_line(self) -> str:
        for text in (self.stderr, self.stdout):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()
        return "no output"


@dataclass(frozen=True)
class GpuRecord:
    label: str                          # "GPU 0 (00000000:18:00.0)", as messages name it
    fields: Mapping[str, object]        # the tool's own structure, nested: path "a/b" is fields["a"]["b"]
    devices: int = 1                    # how many of it the scheduler grants (its MIG devices, else 1)


@dataclass(frozen=True)
class Verdict:
    status: str                         # OK | WARN | FAIL | SKIP, as the doctor's checks
    detail: str
    fix: str = ""


class UnreadableOutput(Exception):
    """The tool answered, but not in the documented format; the message says how."""


# -- reading ----------------------------------------------------------------------------------

def _element_fields(element: ElementTree.Element) -> object:
    children = list(element)
    if not children:
        return (element.text or "").strip()
    fields: dict[str, object] = {}
    for child in children:
        fields.setdefault(child.tag, _element_fields(child))
    return fields


def read_nvidia_smi_xml(text: str, health: Health) -> tuple[GpuRecord, ...]:
    """One record per <gpu> of nvidia-smi -q -x (nvsmi_device_v12/v13.dtd), labelled by its PCI id."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as error:
        raise UnreadableOutput(f"not XML ({error})") from None
    if root.tag != "nvidia_smi_log":
        raise UnreadableOutput(f"the root element is <{root.tag}>, not <nvidia_smi_log>")
    records = []
    for index, gpu in enumerate(root.findall("gpu")):
        fields = _element_fields(gpu)
        partitions = len(gpu.findall(health.partitions)) if health.partitions else 0
        label = f"GPU {index}" + (f" ({gpu.get('id')})" if gpu.get("id") else "")
        records.append(GpuRecord(label, fields if isinstance(fields, dict) else {}, max(1, partitions)))
    return tuple(records)


def read_amd_smi_json(text: str, health: Health) -> tuple[GpuRecord, ...]:
    """amd-smi --json prints a list with one object per GPU, numbered by its "gpu" key."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise UnreadableOutput(f"not JSON ({error})") from None
    if not isinstance(data, list) or not all(isinstance(entry, dict) and "gpu" in entry for entry in data):
        raise UnreadableOutput('not a list of objects with a "gpu" key')
    return tuple(GpuRecord(f"GPU {entry['gpu']}", {k: v for k, v in entry.items() if k != "gpu"}) for entry in data)


def merged(listed: Sequence[GpuRecord], more: Sequence[GpuRecord]) -> tuple[GpuRecord, ...]:
    """The GPUs the first command listed, with the fields another command printed for the same GPU."""
    extra = {record.label: record.fields for record in more}
    return tuple(GpuRecord(r.label, {**r.fields, **extra.get(r.label, {})}, r.devices) for r in listed)


READERS = {"nvidia-smi-xml": read_nvidia_smi_xml, "amd-smi-json": read_amd_smi_json}


def value_at(fields: Mapping[str, object], path: str) -> object:
    """The value at "a/b/c", or None when any part is missing or the GPU reports it as a whole "N/A"."""
    value: object = fields
    for key in path.split("/"):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _reported(value: object) -> bool:
    return value is not None and not (isinstance(value, str) and value.strip().lower() in NOT_REPORTED)


def number(value: object) -> float | None:
    """27, "27 C", "-2 C", {"value": 27, "unit": "C"} (amd-smi from ROCm 6.2); None when not a number."""
    if isinstance(value, Mapping):
        return number(value.get("value"))
    if isinstance(value, bool) or not _reported(value):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = _NUMBER.match(str(value))
    return float(match.group(1)) if match else None


def fails(value: object, fails_when: str) -> bool | None:
    """True when the value means a sick GPU, False when a healthy one, None when the GPU does not say."""
    if not _reported(value):
        return None
    if fails_when == "above_zero":
        count = number(value)
        return None if count is None else count > 0
    if fails_when == "entries":  # amd-smi bad-pages: a page object, a list of them, or "No bad pages found."
        return bool(value) if isinstance(value, (list, Mapping)) else False
    word = str(value).strip().lower()
    flagged = {"yes": ("yes", "no"), "active": ("active", "not active")}[fails_when]
    return True if word == flagged[0] else False if word == flagged[1] else None


def _shown(value: object) -> str:
    if isinstance(value, list):
        return f"{len(value)} page(s)"
    if isinstance(value, Mapping):
        return str(value["value"]) if "value" in value else "1 page"
    return str(value)


# -- judging ----------------------------------------------------------------------------------

def _temperature_problems(record: GpuRecord, health: Health) -> tuple[list[str], bool]:
    problems, read = [], False
    for pair in health.temperatures:
        current = number(value_at(record.fields, pair.current))
        limit = number(value_at(record.fields, pair.limit))
        if current is None or limit is None:
            continue
        read = True
        over = current >= limit if pair.slow_when == "at_or_above" else current <= limit
        if over:
            sign = ">=" if pair.slow_when == "at_or_above" else "<="
            problems.append(f"{pair.current}={current:g} {sign} its slowdown {pair.limit}={limit:g}")
    return problems, read


def judge(records: Sequence[GpuRecord], health: Health, grant: GpuGrant | None, tool: str) -> Verdict:
    """FAIL naming each rule, sick GPU and field; OK naming what the GPUs did not report."""
    problems: dict[str, dict[str, list[str]]] = {}  # rule -> GPU -> "field=value"
    read: set[str] = set()
    for record in records:
        for rule in health.rules:
            for signal in rule.signals:
                value = value_at(record.fields, signal.path)
                verdict = fails(value, signal.fails_when)
                if verdict is not None:
                    read.add(rule.name)
                if verdict:
                    problems.setdefault(rule.name, {}).setdefault(record.label, []).append(
                        f"{signal.path}={_shown(value)}")
        hot, temperature_read = _temperature_problems(record, health)
        if temperature_read:
            read.add(TEMPERATURE)
        if hot:
            problems.setdefault(TEMPERATURE, {})[record.label] = hot
    devices = sum(record.devices for record in records)
    listed = f"{len(records)} GPU(s)" + (f" ({devices} devices to grant)" if devices != len(records) else "")
    failures = [f"{rule}: " + ", ".join(f"{gpu} {' '.join(found)}" for gpu, found in gpus.items())
                for rule, gpus in problems.items()]
    if grant is not None and devices < grant.count:
        failures.append(f"fewer GPUs than granted: {tool} lists {listed}, {grant.source} granted {grant.count}")
    if failures:
        return Verdict("FAIL", "; ".join(failures), FIX)
    names = [rule.name for rule in health.rules] + [TEMPERATURE]
    unread = [name for name in names if name not in read]
    granted = f", {grant.count} granted" if grant is not None else ""
    detail = f"{listed} listed by {tool}{granted}"
    if len(unread) < len(names):
        detail += f"; none has {', '.join(name for name in names if name in read)}"
    if unread:
        detail += f"; not reported by these GPUs: {', '.join(unread)}"
    return Verdict("OK", detail)


def assess(accelerator: Accelerator, grant: GpuGrant | None, found: bool,
           outputs: Sequence[CommandOutput], runtime: str = "apptainer") -> Verdict:
    """The check's result from what the probes saw: the tool on PATH or not, and each command's output;
    runtime is the command that runs the image at this site (apptainer, or LUMI's singularity).

    Without a grant the node is checked only where the tool finds GPUs (a CPU-only node and a job
    without GPUs are silent); with one, a tool that fails on this node fails it, as NHC's checks
    do (Azure/azurehpc-health-checks: "nvidia-smi ... returned error code", FaultCode NHCNA).
    """
    health = accelerator.health
    tool = health.commands[0].argv[0]
    if not found:
        if grant is None:
            return Verdict("SKIP", f"no GPUs granted here and no {tool} on PATH")
        return Verdict("WARN", f"{grant.source} granted {grant.count} GPU(s) but {tool} is not on PATH: "
                               "their health was not read",
                       f"run the image with `{runtime} run {accelerator.apptainer_flag}`, which binds the host's "
                       f"{tool}, or put {tool} on PATH")
    required = outputs[0]
    if required.code != 0:
        if grant is None:
            return Verdict("SKIP", f"no GPUs granted here; `{required.command}` exit {required.code}: "
                                   f"{required.first_line()}")
        return Verdict("FAIL", f"{grant.count} GPU(s) granted ({grant.source}) but `{required.command}` "
                               f"exit {required.code}: {required.first_line()}", FIX)
    read = READERS[health.format]
    try:
        records = read(required.stdout, health)
    except UnreadableOutput as error:
        return Verdict("WARN", f"cannot read the output of `{required.command}`: {error}",
                       f"check that {tool} is the vendor's own (the doctor reads {health.format})")
    notes = []
    for output in outputs[1:]:
        try:
            if output.code != 0:
                raise UnreadableOutput(f"exit {output.code}")
            records = merged(records, read(output.stdout, health))
        except UnreadableOutput as error:
            notes.append(f"`{output.command}` ({error})")
    if not records and grant is None:
        return Verdict("SKIP", f"no GPUs granted here and {tool} lists none")
    verdict = judge(records, health, grant, tool)
    if notes and verdict.status == "OK":
        return Verdict("OK", f"{verdict.detail}; not read: {', '.join(notes)}")
    return verdict
