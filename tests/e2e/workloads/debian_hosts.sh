#!/usr/bin/env bash
# Run "$@" with this node's /etc/hosts as Debian and Ubuntu write it: the node's own name on
# 127.0.1.1 first (Debian Reference, "The hostname resolution"), then the cluster's lines.
# A private mount namespace, so the node's own /etc/hosts and the other tasks are untouched.
set -euo pipefail

if [ "${1-}" != _inside ]; then
    exec unshare --mount --propagation private "$0" _inside "$@"
fi
shift
hosts="$(mktemp)"
trap 'rm -f "${hosts}"' EXIT
{
    printf '127.0.1.1 %s\n' "$(hostname)"
    cat /etc/hosts
} > "${hosts}"
mount --bind "${hosts}" /etc/hosts
"$@"
