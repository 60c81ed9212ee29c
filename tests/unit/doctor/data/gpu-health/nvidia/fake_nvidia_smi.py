"""The fake nvidia-smi (../bin/nvidia-smi runs it), for the doctor's GPU health check where there is no
NVIDIA GPU (unit tests, the e2e clusters): `nvidia-smi -q -x` prints a real driver-580 document changed
field by field (cases.py): the case FAKE_NVIDIA_SMI_CASES names for this node ("node2:ecc" or
"node2:ecc,node3:hot"; the node is $SLURMD_NODENAME, else the host name), healthy for every other
node. "node1:thermal-slowdown>healthy" answers the first reading with one case and every later one
with the next, counting readings in the directory FAKE_NVIDIA_SMI_STATE. Any other arguments are
refused: a caller it was not written for fails loudly instead of reading a made-up answer.
"""
import os
import socket
import sys

import cases  # beside this script, which Python puts first on sys.path


def fail(message):
    print("fake nvidia-smi: " + message, file=sys.stderr)
    sys.exit(2)


def case_for(node, setting):
    for entry in setting.split(","):
        name, _, case = entry.strip().partition(":")
        if name == node and case:
            return case
    return "healthy"


def reading(node, sequence):
    """Which reading this is on node (0 for the first), counted in FAKE_NVIDIA_SMI_STATE."""
    state = os.environ.get("FAKE_NVIDIA_SMI_STATE", "")
    if not state or not os.path.isdir(state):
        fail("the case {!r} is a sequence: set FAKE_NVIDIA_SMI_STATE to a directory to count readings in".format(
            ">".join(sequence)))
    path = os.path.join(state, "{}.readings".format(node))
    count = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as handle:
        handle.write(str(count + 1))
    return count


def main(argv):
    if argv != ["-q", "-x"]:
        fail("only '-q -x' is faked, not '{}'".format(" ".join(argv)))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    sequence = case_for(node, os.environ.get("FAKE_NVIDIA_SMI_CASES", "")).split(">")
    case = sequence[min(reading(node, sequence), len(sequence) - 1)] if len(sequence) > 1 else sequence[0]
    if case not in cases.CASES:
        fail("no case {!r} (node {}): one of {}".format(case, node, ", ".join(sorted(cases.CASES))))
    sys.stdout.write(cases.document(case))


if __name__ == "__main__":
    main(sys.argv[1:])
