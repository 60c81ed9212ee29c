#!/bin/bash
# Before `apptainer build`: say where Apptainer keeps its layer cache and its build sandbox,
# and stop in one line when that filesystem lacks the room an image needs.
#   containers/build-space.sh MIN_FREE_GB     (reads APPTAINER_CACHEDIR and APPTAINER_TMPDIR)
# Make sets both, where the user has not, under BUILD_SCRATCH (see the Makefile); Apptainer's
# own defaults are ~/.apptainer/cache and /tmp (https://apptainer.org/docs/user/latest/build_env.html),
# which the ~20 GB NGC base overflows on a login node (apptainer/apptainer#546: a 56 GB ~/.apptainer).
set -euo pipefail

build_space::err() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# Free space under DIR in whole GiB (POSIX df -P: the 4th field is the available 1K blocks).
build_space::free_gb() {
    local -r dir="$1"
    local kb
    kb="$(df -Pk "${dir}" | awk 'NR == 2 { print $4 }')"
    echo $((kb / 1024 / 1024))
}

build_space::check() {
    local -r name="$1" need_gb="$2"
    local -r dir="${!name:-}"
    [ -n "${dir}" ] || build_space::err "${name} is not set: run this through make (make build-x86), which sets it"
    mkdir -p -- "${dir}" 2>/dev/null \
        || build_space::err "${name}=${dir} cannot be created: set ${name} (or BUILD_SCRATCH=DIR) to a directory you can write"
    local free
    free="$(build_space::free_gb "${dir}")"
    if [ "${free}" -lt "${need_gb}" ]; then
        build_space::err "${name}=${dir} has ${free} GB free, an image build needs about ${need_gb} GB: set BUILD_SCRATCH=DIR (or ${name}) to a larger filesystem, e.g. your scratch or project work area"
    fi
    echo "${name}=${dir} (${free} GB free)"
}

main() {
    local -r need_gb="${1:?usage: containers/build-space.sh MIN_FREE_GB}"
    build_space::check APPTAINER_CACHEDIR "${need_gb}"
    build_space::check APPTAINER_TMPDIR "${need_gb}"
}

main "$@"
