#!/bin/sh
# A stand-in for nvidia-smi where there is no NVIDIA GPU (unit tests, the e2e cluster), for the
# doctor's GPU health check: `nvidia-smi -q -x` prints one of the documents in ../nvidia/, written
# to nvidia-smi's XML schema (nvsmi_device_v12.dtd): the case FAKE_NVIDIA_SMI_CASES names for
# this node ("node2:ecc" or "node2:ecc,node3:hot"; the node is $SLURMD_NODENAME, else the host
# name), healthy for every other node. Any other arguments are refused: a caller it was not
# written for fails loudly instead of reading a made-up answer.
set -eu
if [ "$#" -ne 2 ] || [ "$1" != "-q" ] || [ "$2" != "-x" ]; then
    echo "fake nvidia-smi: only '-q -x' is faked, not '$*'" >&2
    exit 2
fi
node="${SLURMD_NODENAME:-$(hostname)}"
name=healthy
for entry in $(printf '%s' "${FAKE_NVIDIA_SMI_CASES:-}" | tr ',' ' '); do
    if [ "${entry%%:*}" = "${node}" ]; then
        name="${entry#*:}"
    fi
done
document="$(dirname "$0")/../nvidia/${name}.xml"
if [ ! -f "${document}" ]; then
    echo "fake nvidia-smi: no document ${document} for case '${name}' (node ${node})" >&2
    exit 2
fi
cat "${document}"
