#!/usr/bin/env bats
# Spare nodes (DDP_SPARE_NODES, slurm/lib/ddp.sh): which nodes each step runs on, a spare in the place
# of a node the preflight, the gate or a roll call names, and the fallbacks, with srun, scontrol and
# sinfo stubbed. A 3-node training with one spare: a 4-node allocation.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _job_env
    export SLURM_JOB_NUM_NODES=4 SLURM_JOB_NODELIST='node[1-4]' SLURM_NTASKS=4 SLURM_NTASKS_PER_NODE=1
    export DDP_SPARE_NODES=1 DDP_PREFLIGHT=1 DDP_FABRIC_GATE=1 PARTITION_NODES="node1 node2 node3 node4 node5 node6"
}

_srun_lines() {
    grep "^srun .*$1" "${CALLS}"
}

_gate_names() {
    printf '{"ok": false, "bad_nodes": ["%s"], "faults": [{"kind": "slow", "nodes": ["%s"], "measured": "busbw 0.1 GB/s", "expected": ">= 1 GB/s", "cause": "a slow NIC"}]}\n' \
        "$1" "$1" > "${BATS_TEST_TMPDIR}/gate.json"
    export GATE_REPORT="${BATS_TEST_TMPDIR}/gate.json" GATE_STATUS=76 GATE_NAMES="$1"
}

@test "every job script asks SLURM to keep the job when one of its nodes fails (--no-kill)" {
    local script
    for script in "${REPO}"/slurm/*.sh; do
        grep -q '^#SBATCH --requeue$' "${script}" || continue
        run grep -c '^#SBATCH --no-kill$' "${script}"
        assert_output "1"
    done
}

@test "the roll call's report name is the trainer's (ddp_contract.ROLL_CALL_REPORT)" {
    # The host's python3, with the package from this checkout as the job scripts give it (PYTHONPATH).
    PYTHONPATH="${REPO}/entrypoints" run python3 -c 'import ddp_contract; print(ddp_contract.ROLL_CALL_REPORT)'
    assert_success
    local trainers="${output}"
    # What the job scripts see once they source the library, not how the line is spelled.
    run env -i PATH="${PATH}" bash -c 'source "$1" && printf "%s\n" "${DDP_ROLL_CALL_REPORT}"' _ "${REPO}/slurm/lib/ddp.sh"
    assert_success
    assert_output "${trainers}"
}

@test "one spare of four: the preflight on every node, the training (its gate first) and its sampler on the first three" {
    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "spares: 1 of the job's 4 nodes wait as spares, the training runs on 3 (DDP_SPARE_NODES=1, DDP_TRAIN_NODES=2)"
    assert_output --partial "spares: training on node1,node2,node3 (3 of the allocation's 4 nodes), 1 spare(s) left: node4"
    run _srun_lines ' doctor --json '
    assert_output --partial "srun --nodes=4 --ntasks=4 --ntasks-per-node=1 "
    run grep -c ' ddp_train.gate ' "${CALLS}"
    assert_output "0"
    run _srun_lines 'gpu-sampler.sh'
    assert_output --partial "srun --overlap --nodes=3 --ntasks=3 --nodelist=node1,node2,node3 --ntasks-per-node=1 "
    run _train_call
    assert_output --partial "srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get --nodes=3 --ntasks=3 --nodelist=node1,node2,node3 apptainer run "
    assert_output --partial " --fabric-gate --site olivia "
    refute_output --partial "--overlap"
    run grep -c '^srun-env DDP_RECOVERY=' "${CALLS}"
    assert_output "0"  # nothing replaced, nothing to record
}

@test "a node the doctor fails is replaced by the spare: the gate on the healthy nodes, no requeue, the recovery for the trainer" {
    export DOCTOR_FAILS=node2

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "excluded node2 (named by the doctor in job 42, restart 0): interface: eth0 missing"
    assert_output --partial "spares: spare node4 replaces node2 (named by the doctor: interface: eth0 missing): training on node1,node3,node4 (3 of the allocation's 4 nodes), 0 spare(s) left"
    run _train_call
    assert_output --partial "--nodes=3 --ntasks=3 --nodelist=node1,node3,node4 apptainer"
    assert_output --partial " --fabric-gate "  # the gate runs on the training's nodes, the spare among them
    run grep -c '^scontrol \(requeue\|requeuehold\|update\)' "${CALLS}"
    assert_output "0"
    # The training step (the last srun) carries what the trainer records: the swap and the fault's time.
    run bash -c "grep '^srun-env DDP_RECOVERY=' '${CALLS}' | tail -n 1"
    assert_output --regexp '"swaps": \[\{"node": "node2", "by": "doctor", "why": "interface: eth0 missing", "spare": "node4"\}\], "fault_at": [0-9.]+, "named_at": [0-9.]+, "old_step_ended_at": null'
}

@test "a node the trainer's gate names is replaced by the spare: the next step on the survivors and the spare, gated again" {
    _gate_names node3

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "excluded node3 (named by the gate in job 42, restart 0): busbw 0.1 GB/s"
    assert_output --partial "spares: spare node4 replaces node3 (named by the gate: "
    run _train_call
    assert_line --index 0 --partial "--nodes=3 --ntasks=3 --nodelist=node1,node2,node3 apptainer"
    assert_line --index 1 --partial "--nodes=3 --ntasks=3 --nodelist=node1,node2,node4 apptainer"
    assert_line --index 1 --partial " --fabric-gate "
    refute_output --partial "--overlap"  # the first step ended on its own, at its gate
    run grep -c '^scontrol \(requeue\|requeuehold\)' "${CALLS}"
    assert_output "0"
    # The second step nothing resumes (the first trained nothing) records the swap, as after the preflight.
    run grep '^srun-workload-env' "${CALLS}"
    refute_output --partial "DDP_RESUME=1"
    run bash -c "grep '^srun-env DDP_RECOVERY=' '${CALLS}' | tail -n 1"
    assert_output --regexp '"swaps": \[\{"node": "node3", "by": "gate", "why": "busbw 0.1 GB/s[^"]*", "spare": "node4"\}\], "fault_at": [0-9.]+'
}

@test "a user's script with a spare: the gate's own step on every healthy node, the script on the first three" {
    printf 'print(1)\n' > "${BATS_TEST_TMPDIR}/train.py"
    export DOCTOR_FAILS=node2

    run bash "${REPO}/slurm/olivia-multinode.sh" --script "${BATS_TEST_TMPDIR}/train.py"

    assert_success
    run _srun_lines ' ddp_train.gate '
    assert_output --regexp '^srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get --nodes=3 --ntasks=3 --nodelist=node1,node3,node4 apptainer '
    run grep -c -- '--fabric-gate' "${CALLS}"
    assert_output "0"
}

@test "more bad nodes than spares before the training falls back to the requeue without them, exit 76" {
    export DOCTOR_FAILS="node2 node4"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "spares: no spare left: the training needs 3 node(s) and 2 of the allocation's 4 are healthy after excluding node2 (named by the doctor), node4 (named by the doctor) (DDP_SPARE_NODES=1)"
    assert_output --partial "spares: none left for the bad node(s): falling back to a requeue without them (exit 76)"
    run grep '^scontrol \(update\|requeuehold\|release\)' "${CALLS}"
    assert_output "scontrol requeuehold 42
scontrol update JobId=42 ExcNodeList=node2,node4
scontrol release 42"
    run grep -c -- ' -- --data-dir ' "${CALLS}"
    assert_output "0"
    run grep -c 'ddp_train.gate' "${CALLS}"
    assert_output "0"
}

@test "a node lost mid-run: quarantined by the roll call, the next step on the survivors and the spare, --overlap, in the same job" {
    export ROLL_CALL_LOSES=node2

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "excluded node2 (named by the roll call in job 42, restart 0): lost mid-run: none of its ranks answered the roll call after a collective failed"
    assert_output --partial "spares: spare node4 replaces node2 (named by the roll call: lost mid-run: none of its ranks answered the roll call after a collective failed): training on node1,node3,node4"
    assert_output --partial "GPU sampler stopping"
    run _train_call
    assert_line --index 0 --partial "--nodes=3 --ntasks=3 --nodelist=node1,node2,node3 apptainer"
    assert_line --index 1 --partial "--nodes=3 --ntasks=3 --nodelist=node1,node3,node4 --overlap apptainer"
    run _srun_lines 'gpu-sampler.sh'
    assert_line --index 1 --partial "--nodelist=node1,node3,node4"
    run grep -c '^scontrol \(requeue\|requeuehold\)' "${CALLS}"
    assert_output "0"
    # The second training step knows the roll call's times and when the failed step ended.
    run bash -c "grep '^srun-env DDP_RECOVERY=' '${CALLS}' | tail -n 1"
    assert_output --regexp '"by": "roll-call".*"spare": "node4"\}\], "fault_at": 100.0, "named_at": 115.0, "old_step_ended_at": [0-9.]+, "step_started_at"'
    run python3 -c 'import json, sys; print([(e["node"], e["by"]) for e in json.load(open(sys.argv[1]))["excluded"]])' "${DDP_RUN_DIR}/quarantine.json"
    assert_output "[('node2', 'roll-call')]"
    [ ! -e "${DDP_RUN_DIR}/roll-call.json" ]  # each training step starts without an old report
}

@test "a second lost node with the spare used up falls back to the requeue without both, exit 76" {
    export ROLL_CALL_LOSES="node2 node3"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "spares: spare node4 replaces node2"
    assert_output --partial "spares: no spare left: the training needs 3 node(s) and 2 of the allocation's 4 are healthy after excluding node2 (named by the roll call), node3 (named by the roll call)"
    assert_output --partial "spares: none left for the lost node: falling back to a requeue without it (exit 76)"
    run grep -c -- ' -- --data-dir ' "${CALLS}"
    assert_output "2"
    run grep '^scontrol \(update\|requeuehold\|release\)' "${CALLS}"
    assert_output "scontrol requeuehold 42
scontrol update JobId=42 ExcNodeList=node2,node3
scontrol release 42"
}

@test "without spares a node lost mid-run is quarantined and the job requeued without it, exit 76, as a node the gate names" {
    export DDP_SPARE_NODES=0 ROLL_CALL_LOSES=node2

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "excluded node2 (named by the roll call in job 42, restart 0)"
    assert_output --partial "a node was lost mid-run and the job has no spare node (DDP_SPARE_NODES=0): requeuing without it, to resume from the last checkpoint (exit 76)"
    assert_output --partial "ddp: bad node(s) node2: requeuing job 42 without them (restart 1 of 3, exit 76)"
    run _train_call
    refute_output --partial "--nodelist"
    run grep -c -- ' -- --data-dir ' "${CALLS}"
    assert_output "1"
    run grep '^scontrol \(update\|requeuehold\|release\)' "${CALLS}"
    assert_output "scontrol requeuehold 42
scontrol update JobId=42 ExcNodeList=node2
scontrol release 42"
}

@test "a step slurmctld ended for a node it no longer hears, before any roll call, takes that node for lost: exit 76" {
    # SlurmdTimeout (slurm.conf(5)) can end the step before the collective timeout and the roll call: no
    # roll-call.json, the step's status 1, and sinfo's "*" (not responding) on node2, whose slurmd is gone.
    export DDP_SPARE_NODES=0 SRUN_STATUS=1 SINFO_NODE_STATES="node1=alloc node2=down* node3=alloc" SLURMD_DOWN=node2

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "the training step failed with no roll call, and slurmctld stopped hearing from the node (sinfo: not responding or down): ${DDP_RUN_DIR}/roll-call.json"
    assert_output --partial "excluded node2 (named by the roll call in job 42, restart 0): lost mid-run: slurmctld stopped hearing from it (sinfo: down*)"
    assert_output --partial "ddp: bad node(s) node2: requeuing job 42 without them (restart 1 of 3, exit 76)"
    run grep '^scontrol update' "${CALLS}"
    assert_output "scontrol update JobId=42 ExcNodeList=node2"
}

@test "a failed step while every node still answers slurmctld stays a crash: exit 1, nothing excluded" {
    export DDP_SPARE_NODES=0 SRUN_STATUS=1 SINFO_NODE_STATES="node1=alloc node2=alloc node3=alloc"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 1
    refute_output --partial "slurmctld stopped hearing"
    [ ! -e "${DDP_RUN_DIR}/quarantine.json" ]
    run grep -c '^scontrol \(requeue\|requeuehold\|update\)' "${CALLS}"
    assert_output "0"
}

@test "a lost node past DDP_MAX_REQUEUES is not requeued: exit 76 in a line that says so" {
    export DDP_SPARE_NODES=0 ROLL_CALL_LOSES=node2 SLURM_RESTART_COUNT=3

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    assert_output --partial "bad node(s) node2 named, but already requeued 3 times (DDP_MAX_REQUEUES=3): not requeuing"
    assert_output --partial "not requeued: bad node(s) named above (exit 76); the run dir keeps the checkpoint and the quarantine record"
    run grep -c '^scontrol \(requeue\|requeuehold\|update\)' "${CALLS}"
    assert_output "0"
}

@test "a roll-call report that names no node is a crash: exit 1, nothing excluded, no requeue" {
    export DDP_SPARE_NODES=0 SRUN_TRAINING_STEP="${BATS_TEST_TMPDIR}/step"
    # The training step fails after writing a report whose roll call found every rank.
    printf '#!/usr/bin/env bash\nprintf %s "{\\"lost\\": [], \\"cause\\": \\"timeout\\"}" > "%s/roll-call.json"\nexit 1\n' \
        '%s' "${DDP_RUN_DIR}" > "${SRUN_TRAINING_STEP}"
    chmod +x "${SRUN_TRAINING_STEP}"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 1
    assert_output --partial "the failed step's roll call named no node to exclude (${DDP_RUN_DIR}/roll-call.json): exit 1"
    [ ! -e "${DDP_RUN_DIR}/quarantine.json" ]
    run grep -c '^scontrol \(requeue\|requeuehold\)' "${CALLS}"
    assert_output "0"
}

@test "a node the roll call names whose slurmd still answers (its launcher killed: the OOM killer) is kept: the step's 137, no exclusion, no requeue" {
    # A soak of 2-node jobs showed it: SIGKILL of one node's ddp-launch silences all its ranks (they die with
    # it), the roll call names the node as lost, and the healthy node was excluded and the job requeued.
    export DDP_SPARE_NODES=0 ROLL_CALL_LOSES=node2 SLURMD_ANSWERS=node2 ROLL_CALL_STATUS=137

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 137
    assert_output --partial "node2 is up: its slurmd answered after the step failed (its ranks were killed, or stopped, on a live node): a crash, not a lost node"
    assert_output --partial "the failed step's roll call named no node to exclude (${DDP_RUN_DIR}/roll-call.json): exit 137"
    refute_output --partial "excluded node2"
    [ ! -e "${DDP_RUN_DIR}/quarantine.json" ]
    run grep -c '^scontrol \(requeue\|requeuehold\|update\)' "${CALLS}"
    assert_output "0"
    # The probe: a step of `true` on node2 alone, beside the failed step's resources.
    run grep -c -- '^srun --overlap --nodes=1 --ntasks=1 --nodelist=node2 --time=1 --quiet true$' "${CALLS}"
    assert_output "1"
}

@test "with a spare, a named node whose slurmd answers takes no spare: the step's status is the job's" {
    export ROLL_CALL_LOSES=node2 SLURMD_ANSWERS=node2 ROLL_CALL_STATUS=137

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 137
    refute_output --partial "replaces"
    run grep -c -- ' -- --data-dir ' "${CALLS}"
    assert_output "1"
}

@test "a crash on a live node (no roll-call report) is no lost node: no spare, the step's status is the job's" {
    export SRUN_STATUS=137

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 137
    refute_output --partial "replaces"
    run grep -c -- ' -- --data-dir ' "${CALLS}"
    assert_output "1"
}

@test "task mode: the batch host failing the preflight moves rank 0, and the job output follows the new first node's log" {
    export DOCTOR_FAILS=node1 SLURM_NTASKS=16 SLURM_NTASKS_PER_NODE=4
    local -r job_out="${BATS_TEST_TMPDIR}/job.out"
    # The training step writes rank 0's file on the first node of its --nodelist (SLURM runs task 0
    # there), then waits for its line to reach the job output.
    export JOB_OUT="${job_out}" SRUN_TRAINING_STEP="${REPO}/tests/bats/stubs/training-step-on-first-node"

    bash "${REPO}/slurm/raven-task-per-gpu.sh" > "${job_out}" 2>&1 || { cat "${job_out}"; false; }

    run cat "${job_out}"
    assert_line "Epoch 1/50 on the first node"
    run _train_call
    assert_output --partial "--nodes=3 --ntasks=12 --nodelist=node2,node3,node4 --output=${DDP_RUN_DIR}/logs/%j-%N-rank%t.out apptainer"
    [ -e "${DDP_RUN_DIR}/logs/42-node2-rank0.out" ]
}

@test "DDP_SPARE_NODES without room beside the script's training nodes, or no number, stops the job in one line, exit 2, before any srun" {
    export DDP_SPARE_NODES=4
    run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 2
    assert_output "ddp: error: DDP_SPARE_NODES=4: job 42 has 4 node(s), too few for the 2 the job script trains on (DDP_TRAIN_NODES=2) plus 4 spare(s): submit with sbatch --nodes=6"

    export DDP_SPARE_NODES=one
    run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 2
    assert_output --partial "ddp: error: DDP_SPARE_NODES=one is not a number of nodes"

    export DDP_SPARE_NODES=1 DDP_TRAIN_NODES=0
    run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 2
    assert_output "ddp: error: DDP_TRAIN_NODES=0 is not a number of nodes of at least 1: set it to the nodes the training runs on (the job script's #SBATCH --nodes)"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "the spare forgotten on sbatch --nodes (the script's 2 nodes, one a spare) stops in one line naming sbatch --nodes=3, before any file or step" {
    # DDP_SPARE_NODES=1 sbatch slurm/olivia-multinode.sh: SLURM gives the script's #SBATCH --nodes=2.
    export SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='node[1-2]' SLURM_NTASKS=2

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output "ddp: error: DDP_SPARE_NODES=1: job 42 has 2 node(s), too few for the 2 the job script trains on (DDP_TRAIN_NODES=2) plus 1 spare(s): submit with sbatch --nodes=3, or set DDP_TRAIN_NODES=1 to train on 1 node(s) with this allocation"
    run grep -c '^srun\|^scontrol' "${CALLS}"
    assert_output "0"
    [ ! -e "${DDP_RUN_DIR}" ]
}

@test "a 1-node script takes a spare by the same rule: sbatch --nodes=2, the training on one node, the other waits" {
    export SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST='node[1-1]' SLURM_NTASKS=1
    run bash "${REPO}/slurm/olivia-1node-4gpu.sh"
    assert_failure 2
    assert_output "ddp: error: DDP_SPARE_NODES=1: job 42 has 1 node(s), too few for the 1 the job script trains on (DDP_TRAIN_NODES=1) plus 1 spare(s): submit with sbatch --nodes=2"

    export SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='node[1-2]' SLURM_NTASKS=2
    run bash "${REPO}/slurm/olivia-1node-4gpu.sh"
    assert_success
    assert_output --partial "spares: training on node1 (1 of the allocation's 2 nodes), 1 spare(s) left: node2"
    run _train_call
    assert_output --partial "--nodes=1 --ntasks=1 --nodelist=node1 apptainer"
}

@test "more nodes than the script's plus the spares train on all but the spares, as sbatch --nodes=K does without them" {
    export SLURM_JOB_NUM_NODES=5 SLURM_JOB_NODELIST='node[1-5]' SLURM_NTASKS=5

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "spares: 1 of the job's 5 nodes wait as spares, the training runs on 4 (DDP_SPARE_NODES=1, DDP_TRAIN_NODES=2)"
    run _train_call
    assert_output --partial "--nodes=4 --ntasks=4 --nodelist=node1,node2,node3,node4 apptainer"
}

@test "every job script trains on its #SBATCH --nodes and refuses a spare without room, naming --nodes=N+1" {
    local script nodes count=0
    export DDP_SPARE_NODES=1
    for script in "${REPO}"/slurm/*.sh; do
        nodes="$(sed -n 's/^#SBATCH --nodes=\([0-9][0-9]*\)$/\1/p' "${script}")"
        [ -n "${nodes}" ] || continue  # not a job script (gpu-sampler.sh)
        # The allocation SLURM gives the script when sbatch gets no --nodes: its own line.
        SLURM_JOB_NUM_NODES="${nodes}" run bash "${script}"
        assert_failure 2
        assert_output --partial "too few for the ${nodes} the job script trains on (DDP_TRAIN_NODES=${nodes}) plus 1 spare(s): submit with sbatch --nodes=$((nodes + 1))"
        count=$((count + 1))
    done
    [ "${count}" -eq 9 ]
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "a trainer's gate that exits 76 with a report naming no node new to the record: exit 1, not a loop of steps" {
    printf '{"ok": false, "bad_nodes": [], "faults": []}\n' > "${BATS_TEST_TMPDIR}/gate.json"
    export GATE_REPORT="${BATS_TEST_TMPDIR}/gate.json" GATE_STATUS=76

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 1
    assert_output --partial "the training's fabric gate exited 76 and its report named no node new to the quarantine record (${DDP_RUN_DIR}/gate.json): exit 1"
    run _train_call
    assert_equal "${#lines[@]}" 1
    run grep -c '^scontrol \(requeue\|requeuehold\)' "${CALLS}"
    assert_output "0"
}
