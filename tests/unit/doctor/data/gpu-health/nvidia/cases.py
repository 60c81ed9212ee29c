"""nvidia-smi -q -x documents for the GPU health tests, each the real output in real/ changed field by field.

The real output is one H200's (driver 580.159.04, real/README.md). A node's document repeats its <gpu>
with the fields that tell GPUs apart changed (the bus ID, which is also the <gpu id>, the minor number
and the UUID), and each case changes only the fields it is about, at the GPU it names. The unit tests
and the fake nvidia-smi (fake_nvidia_smi.py) build every document here; none is written by hand.
Standard library only: the fake runs inside the test image too.
"""

import copy
import os
from xml.etree import ElementTree

REAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real", "nvidia-smi-q-x.h200-driver580.xml")
GPUS_PER_NODE = 4


def _real_text():
    with open(REAL, encoding="utf-8") as handle:
        return handle.read()


def _header(text):
    """The XML declaration and the DOCTYPE line, which ElementTree does not write back."""
    return text[:text.index("<nvidia_smi_log>")]


def element(gpu, path):
    """The element at path under gpu; a case naming one the real output lacks is a mistake, said loudly."""
    found = gpu.find(path)
    if found is None:
        raise KeyError("the real nvidia-smi output has no <{}> under <gpu>".format(path))
    return found


def set_field(gpu, path, value):
    element(gpu, path).text = value


def add_field(gpu, parent, tag, value):
    """A field the H200's driver does not print but another GPU's does (an A100's absolute slowdown
    temperature)."""
    if gpu.find(parent + "/" + tag) is not None:
        raise KeyError("the real nvidia-smi output has <{}/{}> already: set it".format(parent, tag))
    new = ElementTree.SubElement(element(gpu, parent), tag)
    new.text = value
    return new


def rename_children(gpu, path, old_prefix, new_prefix):
    """Drivers before 535 name <clocks_event_reasons> <clocks_throttle_reasons>, and its children alike."""
    parent = element(gpu, path)
    parent.tag = parent.tag.replace(old_prefix, new_prefix)
    for child in parent:
        child.tag = child.tag.replace(old_prefix, new_prefix)


def _distinct(gpu, index):
    """GPU number index of the node: the next PCI device on the bus, minor number and UUID."""
    device = 6 + index
    bus_id = "00000000:00:{:02X}.0".format(device)
    gpu.set("id", bus_id)
    set_field(gpu, "pci/pci_bus_id", bus_id)
    set_field(gpu, "pci/pci_device", "{:02X}".format(device))
    set_field(gpu, "minor_number", str(index))
    set_field(gpu, "uuid", "GPU-00000000-0000-0000-0000-{:012d}".format(index))


def node_document(gpus=GPUS_PER_NODE, changes=None):
    """The document of a node with gpus GPUs; changes maps a GPU's index to a function that changes
    its <gpu> element, or to {path: value} for fields that exist in the real output."""
    text = _real_text()
    root = ElementTree.fromstring(text)
    (real_gpu,) = root.findall("gpu")
    root.remove(real_gpu)
    set_field(root, "attached_gpus", str(gpus))
    for index in range(gpus):
        gpu = copy.deepcopy(real_gpu)
        _distinct(gpu, index)
        change = (changes or {}).get(index)
        if callable(change):
            change(gpu)
        else:
            for path, value in (change or {}).items():
                set_field(gpu, path, value)
        root.append(gpu)
    return _header(text) + ElementTree.tostring(root, encoding="unicode") + "\n"


SLOWDOWN = "clocks_event_reasons/clocks_event_reason_"


def _pre_535(gpu):
    rename_children(gpu, "clocks_event_reasons", "clocks_event_reason", "clocks_throttle_reason")


def _pre_535_slowdown(gpu):
    _pre_535(gpu)
    set_field(gpu, "clocks_throttle_reasons/clocks_throttle_reason_hw_slowdown", "Active")


def _a100_hot(gpu):
    add_field(gpu, "temperature", "gpu_temp_slow_threshold", "89 C")
    set_field(gpu, "temperature/gpu_temp", "91 C")


def _pre_ampere_pending_pages(gpu):
    """A pre-Ampere GPU retires pages; the H200 prints the flags as N/A."""
    set_field(gpu, "retired_pages/pending_blacklist", "Yes")
    set_field(gpu, "retired_pages/pending_retirement", "Yes")


def _mig(gpu):
    """MIG on: nvidia-smi lists the GPU's MIG devices, and reports remapped rows as a whole N/A."""
    set_field(gpu, "mig_mode/current_mig", "Enabled")
    set_field(gpu, "mig_mode/pending_mig", "Enabled")
    devices = element(gpu, "mig_devices")
    devices.text = "\n"
    for index, instance in enumerate((3, 4, 5, 6)):
        device = ElementTree.SubElement(devices, "mig_device")
        for tag, value in (("index", index), ("gpu_instance_id", instance), ("compute_instance_id", 0)):
            ElementTree.SubElement(device, tag).text = str(value)
    rows = element(gpu, "remapped_rows")
    for child in list(rows):
        rows.remove(child)
    rows.text = "N/A"


# The fake nvidia-smi's cases and the unit tests' documents: name -> (GPUs, changes).
CASES = {
    "healthy": (4, {}),
    "ecc": (4, {2: {"ecc_errors/volatile/dram_uncorrectable": "2"}}),
    "ecc-gpu0": (4, {0: {"ecc_errors/volatile/dram_uncorrectable": "2"}}),
    "remap-pending": (4, {1: {"remapped_rows/remapped_row_pending": "Yes"}}),
    "remap-failure": (4, {3: {"remapped_rows/remapped_row_failure": "Yes"}}),
    "channel-repair-pending": (4, {1: {"ecc_errors/channel_repair_pending": "Yes"}}),
    "tpc-repair-pending": (4, {2: {"ecc_errors/tpc_repair_pending": "Yes"}}),
    "unrepairable-memory": (4, {3: {"ecc_errors/unrepairable_memory": "Yes"}}),
    "retired-pending": (4, {2: _pre_ampere_pending_pages}),
    "hw-slowdown": (4, {0: {SLOWDOWN + "hw_slowdown": "Active"}}),
    "thermal-slowdown": (4, {0: {SLOWDOWN + "hw_thermal_slowdown": "Active", SLOWDOWN + "sw_thermal_slowdown": "Active"}}),
    "old-throttle": (4, {0: _pre_535_slowdown, 1: _pre_535, 2: _pre_535, 3: _pre_535}),
    "hot": (4, {3: _a100_hot}),
    "hot-tlimit": (4, {1: {"temperature/gpu_temp_tlimit": "-3 C"}}),
    "power-capped": (4, {0: {SLOWDOWN + "sw_power_cap": "Active"}}),
    "fewer": (3, {}),
    "mig": (1, {0: _mig}),
    # A node of one GPU (the Ethernet cluster's): healthy, sick, slowed down.
    "one-gpu-healthy": (1, {}),
    "one-gpu-ecc": (1, {0: {"ecc_errors/volatile/dram_uncorrectable": "2"}}),
    "one-gpu-thermal-slowdown": (1, {0: {SLOWDOWN + "sw_thermal_slowdown": "Active"}}),
    # Another job's GPU on a shared node, hot and sick: GPU 3 of the four, which a 1-GPU job is not given.
    "other-job-gpu-sick": (4, {3: {"ecc_errors/volatile/dram_uncorrectable": "4", SLOWDOWN + "sw_thermal_slowdown": "Active",
                                   "temperature/gpu_temp_tlimit": "-5 C"}}),
}


def document(case):
    gpus, changes = CASES[case]
    return node_document(gpus, changes)
