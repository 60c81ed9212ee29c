#!/usr/bin/env bats
# slurm/gpu-sampler.sh: one CSV per node, stopped by PID, silent where there is no GPU.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    export SLURMD_NODENAME=node7
    OUT="${BATS_TEST_TMPDIR}/gpu"
    mkdir -p "${OUT}"
}

_nvidia_smi_stub() {
    _stub nvidia-smi '
[ "$#" -eq 4 ] && [ "$1" = "--query-gpu=timestamp,index,name,utilization.gpu,utilization.memory,memory.total,memory.used" ] \
    && [ "$2" = "--format=csv,nounits" ] && [ "$3" = "-l" ] || { echo "nvidia-smi stub: unknown arguments $*" >&2; exit 2; }
echo "timestamp, index, name, utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.used [MiB]"
while true; do echo "2026/01/01 00:00:00.000, 0, NVIDIA GH200, 97, 40, 97871, 1000"; sleep 0.1; done'
}

@test "without nvidia-smi the sampler says so and exits at once" {
    PATH="${STUBS}:/usr/bin:/bin" run "${REPO}/slurm/gpu-sampler.sh" "${OUT}" 1

    assert_success
    assert_output "gpu-sampler: nvidia-smi not found on node7: no GPU to sample, not monitoring"
    run ls "${OUT}"
    assert_output ""
}

@test "with nvidia-smi the sampler writes gpu-<node>.csv until its PID is sent TERM" {
    _nvidia_smi_stub
    "${REPO}/slurm/gpu-sampler.sh" "${OUT}" 2 2>/dev/null &
    local -r pid=$!
    sleep 1

    kill -TERM "${pid}"
    wait "${pid}"

    run grep '^nvidia-smi' "${CALLS}"
    assert_output "nvidia-smi --query-gpu=timestamp,index,name,utilization.gpu,utilization.memory,memory.total,memory.used --format=csv,nounits -l 2"
    run head -n 2 "${OUT}/gpu-node7.csv"
    assert_line --index 1 "2026/01/01 00:00:00.000, 0, NVIDIA GH200, 97, 40, 97871, 1000"
    run pgrep -f "${STUBS}/nvidia-smi"
    assert_failure
}
