"""GPU health for the preflight: the vendor's tool read into records, judged by the accelerator data.

The tool (nvidia-smi -q -x, amd-smi --json), the fields that mean a sick GPU and where each rule
comes from (NHC, DCGM) are in containers/sites/accelerators/<vendor>.json; here are the readers
for the two output formats, the choice of the GPUs this job was granted, and the judgement, pure:
the doctor runs the commands (its probes), and reads them again when only a state was seen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from xml.etree import ElementTree

from ddp_contract import HARDWARE_CHECKS
from ddp_launch.accelerators import Accelerator, Health
from ddp_launch.gpus import GpuGrant, GrantedDevices

NAME = HARDWARE_CHECKS[0]
# What nvidia-smi and amd-smi print for a value the GPU does not report (nvidia-smi(1), -q: "Any
# unsupported data is indicated by a N/A"); a field the GPU does not report is never a failure.
NOT_REPORTED = {"", "n/a", "not supported", "[not supported]", "requested functionality has been deprecated"}
_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)(?:\s|$)")
TEMPERATURE = "temperature over its slowdown limit"
# How long a state (a clock slowdown, a temperature at its limit) must hold to fail the node: long
# enough for a momentary one to pass (NVML reports the reasons at the moment it is asked,
# nvmlDeviceGetCurrentClocksEventReasons), short enough that the preflight stays fast; the doctor
# waits only when it saw one.
RECHECK_AFTER_S = 5
# A PCI bus ID as nvidia-smi (00000000:18:00.0) and lspci (0000:18:00.0) write it.
_PCI_BUS_ID = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")
_EVIDENCE_LINES = 40     # of a failing command's output


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

    def excerpt(self) -> str:
        lines = (self.stderr + self.stdout).strip().splitlines()
        return "\n".join(lines[:_EVIDENCE_LINES])


@dataclass(frozen=True)
class GpuRecord:
    label: str                          # "GPU 0 (00000000:18:00.0)", as messages name it
    fields: Mapping[str, object]        # the tool's own structure, nested: path "a/b" is fields["a"]["b"]
    devices: int = 1                    # how many of it the scheduler grants (its MIG devices, else 1)
    index: int = 0                      # its place in the tool's list, the number SLURM gives it
    ids: tuple[str, ...] = ()           # other names it answers to: its UUID, its PCI bus ID (normalized)
    raw: str = ""                       # the tool's own text for this GPU, kept as evidence

    def is_named_by(self, name: str) -> bool:
        """Whether a visible-device entry names this GPU: its index, its UUID (CUDA accepts a unique
        prefix), the GPU of a MIG-GPU-<uuid>/<gi>/<ci> device, or its PCI bus ID."""
        word = name.strip().lower()
        if word.isdigit():
            return int(word) == self.index
        if word.startswith("mig-gpu-"):
            word = word[len("mig-"):].split("/")[0]
        if word.startswith("gpu-"):
            return any(i.startswith(word) for i in self.ids if i.startswith("gpu-"))
        bus = pci_bus_id(word)
        return bus is not None and bus in self.ids


@dataclass(frozen=True)
class Verdict:
    status: str                         # OK | WARN | FAIL | SKIP, as the doctor's checks
    detail: str
    fix: str = ""
    evidence: str = ""                  # the tool's output for what failed, for the site's support
    recheck: bool = False               # only states were seen: read again RECHECK_AFTER_S later


@dataclass(frozen=True)
class Finding:
    rule: str
    gpu: str                            # the record's label
    found: tuple[str, ...]              # "path=value", or the temperature against its limit
    state: bool                         # a condition that may pass, not a fault


class UnreadableOutput(Exception):
    """The tool answered, but not in the documented format; the message says how."""


def pci_bus_id(text: str) -> str | None:
    """"18:0.0" style normal form of a PCI bus ID (domain, bus, device, function), or None."""
    match = _PCI_BUS_ID.fullmatch(text.strip().lower())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):x}:{int(bus, 16):x}:{int(device, 16):x}.{function}"


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
    """One record per <gpu> of nvidia-smi -q -x (nvsmi_device_v12/v13.dtd), labelled by its PCI id.

    Its place in the list is its index: nvidia-smi lists GPUs in NVML's order, by PCI bus ID, the
    order SLURM numbers them in (SLURM's gres.html, "NVML ... numbers GPUs in order by their PCI bus
    IDs"; src/plugins/gres/common/gres_common.c: GPU IDs "match the order they enumerate on the PCI
    bus"). <minor_number> is the N of /dev/nvidiaN, which need not follow that order (gres.html).
    """
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
        ids = tuple(i for i in ((gpu.findtext("uuid") or "").strip().lower(),
                                pci_bus_id(gpu.findtext("pci/pci_bus_id") or gpu.get("id") or "")) if i)
        records.append(GpuRecord(label, fields if isinstance(fields, dict) else {}, max(1, partitions), index, ids,
                                 ElementTree.tostring(gpu, encoding="unicode")))
    return tuple(records)


def read_amd_smi_json(text: str, health: Health) -> tuple[GpuRecord, ...]:
    """amd-smi --json: one object per GPU, numbered by its "gpu" key, as a list, or as the "gpu_data"
    list of an object (the amd-smi releases that report CPUs too: cpu_data, core_data, gpu_data)."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise UnreadableOutput(f"not JSON ({error})") from None
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        data = data["gpu_data"]
    if not isinstance(data, list) or not all(isinstance(entry, dict) and "gpu" in entry for entry in data):
        raise UnreadableOutput('neither a list of objects with a "gpu" key nor an object with such a "gpu_data" list')
    return tuple(GpuRecord(f"GPU {entry['gpu']}", {k: v for k, v in entry.items() if k != "gpu"},
                           index=int(entry["gpu"]) if str(entry["gpu"]).isdigit() else -1,
                           raw=json.dumps(entry, indent=1)) for entry in data)


def merged(listed: Sequence[GpuRecord], more: Sequence[GpuRecord]) -> tuple[GpuRecord, ...]:
    """The GPUs the first command listed, with the fields another command printed for the same GPU."""
    extra = {record.label: record for record in more}
    return tuple(replace(r, fields={**r.fields, **extra[r.label].fields}, raw=f"{r.raw}\n{extra[r.label].raw}")
                 if r.label in extra else r for r in listed)


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


# -- which GPUs are this job's ------------------------------------------------------------------

def _indices(records: Sequence[GpuRecord]) -> str:
    return "GPU " + ", ".join(str(r.index) for r in records)


def granted_records(records: Sequence[GpuRecord], grant: GpuGrant | None,
                    devices: GrantedDevices | None, tool: str) -> tuple[tuple[GpuRecord, ...], str]:
    """The GPUs this job was granted, and how the OK line says which were judged.

    Where the tool lists no more than the grant, every GPU it lists is the job's: the whole node,
    or a device cgroup that lets it see only the granted GPUs (renumbered from 0, so the scheduler's
    IDs would name the wrong ones). Where it lists more, the node is shared and only the GPUs the
    grant names are the job's; when a name matches none, all are judged, as before names were read.
    """
    listed = sum(record.devices for record in records)
    everything = tuple(records)
    if grant is None or listed <= grant.count:
        return everything, f"judged all: {_indices(records)}"
    if devices is None:
        return everything, f"judged all: {_indices(records)} (nothing names the {grant.count} granted)"
    chosen = tuple(r for r in records if any(r.is_named_by(name) for name in devices.names))
    unmatched = [name for name in devices.names if not any(r.is_named_by(name) for r in records)]
    if unmatched or not chosen:
        return everything, (f"judged all: {_indices(records)} ({devices.variable} names {', '.join(unmatched)}, "
                            f"which no GPU {tool} lists answers to by index, UUID or PCI bus ID)")
    return chosen, f"judged {_indices(chosen)}, the one(s) {devices.source} grants (the others are other jobs')"


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


def find(records: Sequence[GpuRecord], health: Health) -> tuple[tuple[Finding, ...], frozenset[str]]:
    """Each rule failing on each GPU, and the rules some GPU reported at all."""
    found: list[Finding] = []
    read: set[str] = set()
    for record in records:
        for rule in health.rules:
            hits = []
            for signal in rule.signals:
                value = value_at(record.fields, signal.path)
                verdict = fails(value, signal.fails_when)
                if verdict is not None:
                    read.add(rule.name)
                if verdict:
                    hits.append(f"{signal.path}={_shown(value)}")
            if hits:
                found.append(Finding(rule.name, record.label, tuple(hits), rule.kind == "state"))
        hot, temperature_read = _temperature_problems(record, health)
        if temperature_read:
            read.add(TEMPERATURE)
        if hot:
            found.append(Finding(TEMPERATURE, record.label, tuple(hot), True))
    return tuple(found), frozenset(read)


def _describe(findings: Sequence[Finding]) -> list[str]:
    rules: dict[str, list[str]] = {}
    for finding in findings:
        rules.setdefault(finding.rule, []).append(f"{finding.gpu} {' '.join(finding.found)}")
    return [f"{rule}: {', '.join(gpus)}" for rule, gpus in rules.items()]


def failure_fix(node: str, command: str, state: bool) -> str:
    """What the user can do: leave the node out, and give the site's support what it needs."""
    why = ("a GPU that stays slowed down or hot has a cooling or power fault"
           if state else "a reset or a repair of the GPU is for the site's admins")
    return (f"leave out {node}: a job's preflight excludes it and requeues without it (runs/<job>/quarantine.json); "
            f"submitting by hand, add `--exclude={node}` to sbatch; report it to your site's support with the node "
            f"name, this line and the output of `{command}` (this check's evidence in `ddp-launch doctor --json`, "
            f"and in a job's runs/<job>/preflight/<job>/doctor-{node}.json): {why}")


def _evidence(records: Sequence[GpuRecord], findings: Sequence[Finding]) -> str:
    failing = {finding.gpu for finding in findings}
    return "\n".join(record.raw for record in records if record.label in failing and record.raw)


def assess(accelerator: Accelerator, grant: GpuGrant | None, found: bool,
           outputs: Sequence[CommandOutput], runtime: str = "apptainer", devices: GrantedDevices | None = None,
           node: str = "this node", again: Sequence[CommandOutput] | None = None) -> Verdict:
    """The check's result from what the probes saw: the tool on PATH or not, and each command's output;
    runtime is the command that runs the image at this site (apptainer, or LUMI's singularity).

    Without a grant the node is checked only where the tool finds GPUs (a CPU-only node and a job
    without GPUs are silent); with one, a tool that fails on this node fails it, as NHC's checks
    do (Azure/azurehpc-health-checks: "nvidia-smi ... returned error code", FaultCode NHCNA).
    A fault fails at once; a state (a rule of kind "state", a temperature) seen with no fault asks
    for a second reading (recheck), given as again, and fails only where it holds in both.
    """
    health = accelerator.health
    tool = health.commands[0].argv[0]
    command = " ".join(health.commands[0].argv)
    if not found:
        if grant is None:
            return Verdict("SKIP", f"no GPUs granted here and no {tool} on PATH")
        return Verdict("WARN", f"{grant.source} granted {grant.count} GPU(s) but {tool} is not on PATH: "
                               "their health was not read", health.missing_tool_fix(runtime))
    sample = _read(outputs, health, grant, tool, node)
    if isinstance(sample, Verdict):
        return sample
    records, notes = sample
    if not records and grant is None:
        return Verdict("SKIP", f"no GPUs granted here and {tool} lists none")
    judged, which = granted_records(records, grant, devices, tool)
    findings, read = find(judged, health)
    faults = [f for f in findings if not f.state]
    states = [f for f in findings if f.state]
    devices_listed = sum(record.devices for record in records)
    listed = f"{len(records)} GPU(s)" + (f" ({devices_listed} devices to grant)" if devices_listed != len(records) else "")
    shortage = (grant is not None and devices_listed < grant.count)
    if states and not faults and not shortage and again is None:
        return Verdict("FAIL", "; ".join(_describe(states)), failure_fix(node, command, True),
                       _evidence(judged, states), recheck=True)
    passed: list[Finding] = []
    evidence = _evidence(judged, faults)
    if again is not None and states:
        second = _second_reading(again, states, health, grant, devices, tool, node)
        if isinstance(second, Verdict):
            return second
        states, faults, passed, held_evidence = second.states, faults + second.faults, second.passed, second.evidence
        evidence = "\n".join(text for text in (evidence, held_evidence) if text)
    failures = _describe(faults) + _describe(states)
    if shortage:
        failures.append(f"fewer GPUs than granted: {tool} lists {listed}, {grant.source} granted {grant.count}")
        evidence = evidence or "\n".join(record.raw for record in records)
    if failures:
        return Verdict("FAIL", "; ".join(failures), failure_fix(node, command, not faults and not shortage), evidence)
    granted = f", {grant.count} granted" if grant is not None else ""
    return Verdict("OK", _ok_detail(f"{listed} listed by {tool}{granted}; {which}", health, read, passed, notes))


@dataclass(frozen=True)
class _SecondReading:
    states: list            # the first reading's states that held, as the second reading shows them
    faults: list            # faults that showed only in the second reading
    passed: list            # the first reading's states that were gone
    evidence: str


def _second_reading(again: Sequence[CommandOutput], states: Sequence[Finding], health: Health,
                    grant: GpuGrant | None, devices: GrantedDevices | None, tool: str,
                    node: str) -> Verdict | _SecondReading:
    """Which of the first reading's states still hold (the same rule on the same GPU)."""
    second = _read(again, health, grant, tool, node)
    if isinstance(second, Verdict):
        if second.status == "FAIL":
            return second
        unread = f" (in the first reading; the second: {second.detail})"
        return _SecondReading([replace(f, found=(*f.found[:-1], f.found[-1] + unread)) for f in states], [], [], "")
    judged, _ = granted_records(second[0], grant, devices, tool)
    found, _ = find(judged, health)
    first = {(f.rule, f.gpu) for f in states}
    held = [f for f in found if f.state and (f.rule, f.gpu) in first]
    seen_again = {(f.rule, f.gpu) for f in held}
    note = f" (held in two readings {RECHECK_AFTER_S} s apart)"
    return _SecondReading([replace(f, found=(*f.found[:-1], f.found[-1] + note)) for f in held],
                          [f for f in found if not f.state],
                          [f for f in states if (f.rule, f.gpu) not in seen_again],
                          _evidence(judged, [f for f in found if not f.state or (f.rule, f.gpu) in first]))


def _ok_detail(head: str, health: Health, read: frozenset[str], passed: Sequence[Finding], notes: Sequence[str]) -> str:
    names = [rule.name for rule in health.rules] + [TEMPERATURE]
    unread = [name for name in names if name not in read]
    detail = head
    if len(unread) < len(names):
        detail += f"; none has {', '.join(name for name in names if name in read)}"
    if passed:
        detail += (f"; {'; '.join(_describe(passed))} in a first reading passed within {RECHECK_AFTER_S} s "
                   "(a momentary state, not a fault)")
    if unread:
        detail += f"; not reported by these GPUs: {', '.join(unread)}"
    if notes:
        detail += f"; not read: {', '.join(notes)}"
    return detail


def _read(outputs: Sequence[CommandOutput], health: Health, grant: GpuGrant | None, tool: str,
          node: str) -> Verdict | tuple[tuple[GpuRecord, ...], list[str]]:
    """The records one reading of the commands gives, with a note per optional command that failed,
    or the verdict when the required command failed or printed no documented output."""
    required = outputs[0]
    if required.code != 0:
        if grant is None:
            return Verdict("SKIP", f"no GPUs granted here; `{required.command}` exit {required.code}: "
                                   f"{required.first_line()}")
        return Verdict("FAIL", f"{grant.count} GPU(s) granted ({grant.source}) but `{required.command}` "
                               f"exit {required.code}: {required.first_line()}",
                       failure_fix(node, required.command, False), required.excerpt())
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
    return records, notes
