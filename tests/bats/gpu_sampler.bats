#!/usr/bin/env bats
# slurm/gpu-sampler.sh: one CSV per node, stopped by PID, silent where there is no GPU; the tool
# is the site's vendor's (nvidia-smi by default, rocm-smi for an AMD site such as lumi).

setup() {
    load 'test_helper/common-setup'
    _common_setup
    export SLURMD_NODENAME=node7
    OUT="${BATS_TEST_TMPDIR}/gpu"
    mkdir -p "${OUT}"
}

@test "without nvidia-smi the sampler says so and exits at once" {
    PATH="${STUBS}:/usr/bin:/bin" run "${REPO}/slurm/gpu-sampler.sh" "${OUT}" 1

    assert_success
    assert_output "gpu-sampler: nvidia-smi not found on node7: no GPU to sample, not monitoring"
    run ls "${OUT}"
    assert_output ""
}

@test "with nvidia-smi the sampler writes gpu-<node>.csv until its PID is sent TERM" {
    _stub nvidia-smi
    "${REPO}/slurm/gpu-sampler.sh" "${OUT}" 2 2>/dev/null &
    local -r pid=$!
    # The sampler first asks python3 which tool the site samples with: wait, with a bound, for a row.
    local waited=0 lines=0
    until [ "${lines}" -ge 2 ] || [ "${waited}" -ge 300 ]; do
        sleep 0.1
        waited=$((waited + 1))
        lines="$(wc -l < "${OUT}/gpu-node7.csv" 2>/dev/null || true)"
        lines="${lines:-0}"
    done

    kill -TERM "${pid}"
    wait "${pid}"

    run grep '^nvidia-smi' "${CALLS}"
    assert_output "nvidia-smi --query-gpu=timestamp,index,name,utilization.gpu,utilization.memory,memory.total,memory.used --format=csv,nounits -l 2"
    run head -n 2 "${OUT}/gpu-node7.csv"
    assert_line --index 1 "2026/01/01 00:00:00.000, 0, NVIDIA GH200, 97, 40, 97871, 1000"
    run pgrep -f "${STUBS}/nvidia-smi"
    assert_failure
}

@test "an AMD site without rocm-smi: the sampler names rocm-smi and exits at once" {
    DDP_SITE=lumi PATH="${STUBS}:/usr/bin:/bin" run "${REPO}/slurm/gpu-sampler.sh" "${OUT}" 1

    assert_success
    assert_output "gpu-sampler: rocm-smi not found on node7: no GPU to sample, not monitoring"
    run ls "${OUT}"
    assert_output ""
}

@test "an AMD site samples rocm-smi every interval into one CSV with a timestamp column, until TERM" {
    _stub rocm-smi
    DDP_SITE=lumi "${REPO}/slurm/gpu-sampler.sh" "${OUT}" 1 2>/dev/null &
    local -r pid=$!
    # Two samples (a second apart), waited for with a bound rather than a fixed sleep: the
    # machine may be slow to start python3 and rocm-smi.
    local waited=0 rows=0
    until [ "${rows}" -ge 2 ] || [ "${waited}" -ge 300 ]; do
        sleep 0.1
        waited=$((waited + 1))
        rows="$(grep -c ',card1,' "${OUT}/gpu-node7.csv" 2>/dev/null || true)"
        rows="${rows:-0}"
    done

    kill -TERM "${pid}"
    wait "${pid}"

    run grep -c '^rocm-smi --showuse --showmemuse --showmeminfo vram --showpower --csv$' "${CALLS}"
    [ "${output}" -ge 2 ]
    run grep -c '^timestamp,' "${OUT}/gpu-node7.csv"
    assert_output "1"
    run head -n 1 "${OUT}/gpu-node7.csv"
    assert_output "timestamp,device,GPU use (%),GPU Memory Allocated (VRAM%),VRAM Total Memory (B),VRAM Total Used Memory (B),Average Graphics Package Power (W)"
    run sed -n 2p "${OUT}/gpu-node7.csv"
    assert_output --regexp '^[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3},card0,97,40,68702699520,27481079808,488\.0$'
    run grep -c ',card1,' "${OUT}/gpu-node7.csv"
    [ "${output}" -ge 2 ]
    run pgrep -f "${STUBS}/rocm-smi"
    assert_failure
}

@test "a site the sampler cannot read: it says so and monitors nothing" {
    DDP_SITE=nosuchsite run "${REPO}/slurm/gpu-sampler.sh" "${OUT}" 1

    assert_failure
    assert_output --partial "unknown site 'nosuchsite'"
    assert_output --partial "gpu-sampler: cannot tell the site's sampler (see above): not monitoring"
    run ls "${OUT}"
    assert_output ""
}
