#!/usr/bin/env bash
# docker(1) for the README's RunAI block (tests/unit/containers/test_runai_readme.py, the RCP twin):
# `login HOST`, `build --platform linux/amd64 -f FILE -t TAG .` with FILE relative to the working
# directory, `push TAG` of a TAG built before, each call appended to $DOCKER_CALLS. Anything else fails.
set -euo pipefail
printf '%s\n' "docker $*" >> "${DOCKER_CALLS}"
case "$*" in
    "login ic-registry.epfl.ch") exit 0 ;;
    "build --platform linux/amd64 -f "*" -t "*" .")
        if [ "$#" -ne 8 ] || [ ! -f "$5" ]; then
            echo "docker stand-in: no Dockerfile $5" >&2
            exit 1
        fi
        printf '%s\n' "$7" >> "${DOCKER_CALLS}.built" ;;
    "push "*)
        if [ "$#" -ne 2 ] || ! grep -qxF -- "$2" "${DOCKER_CALLS}.built" 2>/dev/null; then
            echo "docker stand-in: $2 was not built" >&2
            exit 1
        fi ;;
    *) echo "docker stand-in: unknown arguments $*" >&2; exit 1 ;;
esac
