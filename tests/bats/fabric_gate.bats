#!/usr/bin/env bats
# The preflight and the fabric gate before training (the built-in trainer's first thing, or a step of its
# own before a user's script), and the requeue without a bad node (slurm/lib/ddp.sh), with srun, scontrol
# and sinfo stubbed.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _job_env
    export DDP_PREFLIGHT=1 DDP_FABRIC_GATE=1
}

_gate_report_naming() {
    local -r node="$1"
    printf '{"ok": false, "bad_nodes": ["%s"], "faults": [{"kind": "corrupt", "nodes": ["%s"], "measured": "15 wrong element(s)", "expected": "0 wrong", "cause": "a faulty NIC"}]}\n' \
        "${node}" "${node}" > "${BATS_TEST_TMPDIR}/gate.json"
    export GATE_REPORT="${BATS_TEST_TMPDIR}/gate.json" GATE_NAMES="${node}"
}

@test "the doctor on every node, then the training, whose ranks run the gate before their first step" {
    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "fabric gate: in the training step, on the trainer's process group before its first step (ddp-train --fabric-gate)"
    run grep '^srun .* apptainer ' "${CALLS}"
    assert_line --index 0 "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=0 --output=${DDP_RUN_DIR}/preflight/42/doctor-%N.json --error=${DDP_RUN_DIR}/preflight/42/doctor-%N.err apptainer run --nv ${DDP_IMAGE} doctor --json --site olivia --data-dir ${DDP_DATA_DIR}"
    # The site's profile judges the gate's bandwidth, as the gate's own step's --site did.
    assert_line --index 1 --partial "srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get apptainer run --nv ${DDP_IMAGE} --site olivia --log-dir ${DDP_RUN_DIR}/logs/42 -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --fabric-gate --site olivia --recipe improved --epochs 100 "
    run grep -c '^srun .* apptainer ' "${CALLS}"
    assert_output "2"  # no step of the gate's own
}

@test "a user's script in task mode: the gate's step keeps its per-rank logs apart from the training's" {
    printf 'print(1)\n' > "${BATS_TEST_TMPDIR}/train.py"

    run bash "${REPO}/slurm/raven-task-per-gpu.sh" --script "${BATS_TEST_TMPDIR}/train.py"

    assert_success
    run grep '^srun .* ddp_train.gate ' "${CALLS}"
    assert_output --partial "--output=${DDP_RUN_DIR}/logs/gate/%j-%N-rank%t.out apptainer run --nv ${DDP_IMAGE} --site raven --mode slurm-task --module ddp_train.gate"
    run grep -c -- '--fabric-gate' "${CALLS}"
    assert_output "0"  # the script's own process group is not ours to measure on
}

@test "DDP_FABRIC_GATE=0 and DDP_PREFLIGHT=0 skip their steps, and say so" {
    export DDP_FABRIC_GATE=0 DDP_PREFLIGHT=0

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "fabric gate skipped (DDP_FABRIC_GATE=0)"
    assert_output --partial "preflight skipped (DDP_PREFLIGHT=0)"
    run grep -c '^srun .* apptainer ' "${CALLS}"
    assert_output "1"
    run grep -c -- '--fabric-gate' "${CALLS}"
    assert_output "0"
}

@test "a node the gate names is recorded, the job requeued held, given ExcNodeList, released, exit 76" {
    _gate_report_naming node2
    export GATE_STATUS=76 PARTITION_NODES="node1 node2 node3"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "excluded node2 (named by the gate in job 42, restart 0): 15 wrong element(s) (expected 0 wrong); likely cause: a faulty NIC"
    assert_output --partial "bad node(s) node2: requeuing job 42 without them (restart 1 of 3, exit 76)"
    run grep '^scontrol \(update\|requeue\|release\)' "${CALLS}"
    assert_output "scontrol requeuehold 42
scontrol update JobId=42 ExcNodeList=node2
scontrol release 42"
    # One training step, which its gate ended before the first step: exit 76 from the trainer.
    run grep -c -- ' -- --data-dir .* --fabric-gate ' "${CALLS}"
    assert_output "1"
}

@test "a user's script: a node the gate's own step names is requeued without it, and the script never starts" {
    printf 'print(1)\n' > "${BATS_TEST_TMPDIR}/train.py"
    _gate_report_naming node2
    export GATE_STATUS=76 PARTITION_NODES="node1 node2 node3"

    run bash "${REPO}/slurm/olivia-multinode.sh" --script "${BATS_TEST_TMPDIR}/train.py"

    assert_failure 76
    assert_output --partial "excluded node2 (named by the gate in job 42, restart 0): 15 wrong element(s)"
    assert_output --partial "bad node(s) node2: requeuing job 42 without them (restart 1 of 3, exit 76)"
    run grep -cE "^srun .* apptainer .* --script ${BATS_TEST_TMPDIR}/train.py --( |$)" "${CALLS}"
    assert_output "0"  # the script's step; the doctor's checks the script, --script PATH --data-dir
}

@test "a node the doctor fails is excluded before the gate runs" {
    export DOCTOR_FAILS=node2 PARTITION_NODES="node1 node2 node3"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "excluded node2 (named by the doctor in job 42, restart 0): interface: eth0 missing"
    run grep -c 'ddp_train.gate' "${CALLS}"
    assert_output "0"
    run grep '^scontrol update' "${CALLS}"
    assert_output "scontrol update JobId=42 ExcNodeList=node2"
}

# The fabric gate's rule for NCCL on sockets (src/ddp_train/gate/judge.py, decide): on every node it is
# "a setup problem, not a node". The preflight keeps the same rule for a check every doctor FAILs.
@test "a check that every node's doctor fails stops the job in one line with the fix, exit 2, nothing excluded or requeued" {
    export DOCTOR_FAILS="node1 node2" PARTITION_NODES="node1 node2 node3"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_line "ddp: error: preflight: ddp-launch doctor fails 'interface' on every node of the job (2 of 2): eth0 missing: a setup problem, not a bad node, so nothing is excluded or requeued; fix: unset NCCL_SOCKET_IFNAME"
    refute_output --partial "excluded node"
    run grep -c '^scontrol \(requeue\|update\|release\)\|ddp_train.gate\| -- --data-dir ' "${CALLS}"
    assert_output "0"
    [ ! -e "${DDP_RUN_DIR}/quarantine.json" ]
}

@test "a FAIL on the only node of a 1-node job is the setup's too: exit 2, the node named for an --exclude" {
    export SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST=node1 DOCTOR_FAILS=node1

    run bash "${REPO}/slurm/olivia-1gpu.sh"

    assert_failure 2
    assert_line --partial "ddp: error: preflight: ddp-launch doctor fails 'interface' on the job's only node (node1; if the node is at fault, resubmit with sbatch --exclude=node1): eth0 missing"
    run grep -c '^scontrol \(requeue\|update\|release\)' "${CALLS}"
    assert_output "0"
    [ ! -e "${DDP_RUN_DIR}/quarantine.json" ]
}

@test "the requeued job lists the nodes excluded so far and why" {
    mkdir -p "${DDP_RUN_DIR}"
    printf '{"schema": 1, "excluded": [{"node": "node3", "by": "gate", "why": "slow", "job": "41", "restart": 0}]}\n' \
        > "${DDP_RUN_DIR}/quarantine.json"
    export SLURM_RESTART_COUNT=1

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "excluded node3 (named by the gate in job 41, restart 0): slow"
}

@test "out of healthy nodes: one line and no requeue" {
    _gate_report_naming node2
    export GATE_STATUS=76 PARTITION_NODES="node1 node2"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "out of healthy nodes: the job needs 2 node(s), 1 of the partition's 2 are left after excluding node2: not requeuing"
    run grep -c '^scontrol \(update\|requeue\)' "${CALLS}"
    assert_output "0"
}

@test "a bad node past DDP_MAX_REQUEUES is not requeued" {
    _gate_report_naming node2
    export GATE_STATUS=76 SLURM_RESTART_COUNT=3 PARTITION_NODES="node1 node2 node3"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "bad node(s) node2 named, but already requeued 3 times (DDP_MAX_REQUEUES=3): not requeuing"
    run grep -c '^scontrol \(update\|requeue\)' "${CALLS}"
    assert_output "0"
}

@test "a gate that fails without naming a node stops the job without a requeue" {
    printf '{"ok": false, "bad_nodes": [], "faults": []}\n' > "${BATS_TEST_TMPDIR}/gate.json"
    export GATE_STATUS=1 GATE_REPORT="${BATS_TEST_TMPDIR}/gate.json"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 1
    assert_output --partial "fabric gate failed (exit 1) without naming a node"
    run grep -c '^scontrol \(update\|requeue\)' "${CALLS}"
    assert_output "0"
}

@test "a stop signal during a user's script's gate step (exit 75) requeues like one during training, with no training step" {
    printf 'print(1)\n' > "${BATS_TEST_TMPDIR}/train.py"
    export GATE_STATUS=75

    run bash "${REPO}/slurm/olivia-multinode.sh" --script "${BATS_TEST_TMPDIR}/train.py"

    assert_success
    assert_output --partial "requeuing job 42 (restart 1 of 3)"
    run grep -cE "^srun .* apptainer .* --script ${BATS_TEST_TMPDIR}/train.py --( |$)" "${CALLS}"
    assert_output "0"  # the script's step; the doctor's checks the script, --script PATH --data-dir
}
