#!/usr/bin/env bats
# Every shell script parses and is shellcheck clean (make lint runs the same check).

setup() {
    load 'test_helper/common-setup'
    _common_setup
    SCRIPTS=("${REPO}"/slurm/*.sh "${REPO}"/slurm/lib/*.sh "${REPO}"/runai/*.sh "${REPO}"/tests/e2e/cluster/*.sh "${REPO}"/containers/*.sh
             "${REPO}"/tests/unit/doctor/data/gpu-health/bin/* "${REPO}"/tests/bats/stubs/*)
}

@test "every shell script parses with bash -n" {
    local script
    for script in "${SCRIPTS[@]}"; do
        run bash -n "${script}"
        assert_success
    done
}

@test "every shell script is shellcheck clean" {
    command -v shellcheck >/dev/null || skip "shellcheck not installed (apt-get install shellcheck)"
    run shellcheck -x "${SCRIPTS[@]}"
    assert_success
}
