#!/usr/bin/env bash
# A real SLURM cluster on one machine: one network namespace per compute node, every
# daemon inside a root of its own (DDP_E2E_ROOT: Debian sid with SLURM, munge and the
# real Apptainer, built by tests/e2e/apptainer_root.py).
# Usage: cluster.sh up [N] | down | status | env | nodes | exec NODE CMD... | run CMD... | crash NODE | revive NODE
# (run as root). crash: SIGKILL a node's slurmd and processes; revive: its link up, slurmd again;
# nodes: the node names, one a line.
#
# The root is entered with pivot_root in a private mount namespace (Apptainer refuses a
# chroot: "Running inside a weak chrooted environment, prefer pivot_root"). One "holder"
# process keeps that namespace; munged, slurmctld and each slurmd join it (nsenter). The
# host paths the tests use are bound in at the same paths (DDP_E2E_ROOT_BINDS, plus /tmp
# and /var/tmp), so a path means the same inside and out. /dev/fuse there is a private
# node, mode 0666, so unprivileged Apptainer can mount a SIF with squashfuse as it does on
# clusters; the machine's own /dev/fuse is not changed.
#
# Layout (all names carry the prefix, default "ddpe2e", so nothing else is touched):
#   bridge PREFIX-br  SUBNET.1/24 (default 10.77.0.1) in the root namespace: slurmctld, munged, clients
#   netns  PREFIX-nodeK, veth PREFIX-vK <-> eth0  SUBNET.(10+K): "slurmd -N nodeK"
#   state  $DDP_E2E_STATE (default /tmp/ddp-e2e-cluster): slurm.conf, logs, spool, pids
# slurmd runs under its own UTS namespace (hostname nodeK) and its own mount
# namespace, where a private hosts file is bound over /etc/hosts, so node names
# resolve inside the cluster and the machine's /etc/hosts is never edited.
# Clients: export SLURM_CONF="$DDP_E2E_STATE/etc/slurm.conf" (cluster.sh env prints it).
# Ports: slurmctld 46817, slurmd 46818 by default (unlikely to collide with a real SLURM).
#
# A twin (DDP_E2E_TWIN=NAME, the facts in tests/e2e/cluster/twins/NAME.sh) is this cluster with a
# real one's facts: its node names and /etc/hosts lines, its network interfaces, its partitions,
# features and GPUs in slurm.conf and gres.conf, the container command it has. DDP_E2E_TWIN_TREE is
# a directory of the files its nodes have and this machine lacks, at their paths: the host
# libraries (root/), device files (dev/) and /sys/class entries (sys/class/). Each lies over the
# root's own in an overlay mount, the libraries for the whole cluster (an overlay root whose
# changes go to the state directory: the shared root is never written), dev/ and sys/class/ in
# each node's mount namespace, over the node's /dev and its own sysfs.
set -euo pipefail

# DDP_E2E_PREFIX / DDP_E2E_SUBNET / DDP_E2E_PORT let several clusters coexist on one
# machine (one per working tree); the defaults are the ones CI uses.
readonly PREFIX="${DDP_E2E_PREFIX:-ddpe2e}"
readonly CLUSTER_NAME="${PREFIX}"
readonly BRIDGE="${PREFIX}-br"
readonly UPLINK_BRIDGE="${PREFIX}-up"
readonly SUBNET_PREFIX="${DDP_E2E_SUBNET:-10.77.0}"
readonly CONTROLLER_ADDR="${SUBNET_PREFIX}.1"
readonly SLURMCTLD_PORT="${DDP_E2E_PORT:-46817}"
readonly SLURMD_PORT="$((SLURMCTLD_PORT + 1))"
readonly STATE="${DDP_E2E_STATE:-/tmp/ddp-e2e-cluster}"
readonly UP_TIMEOUT_S="${DDP_E2E_UP_TIMEOUT:-60}"
readonly ROOT_DIR="${DDP_E2E_ROOT:-}"
readonly HOLDER_PID="${STATE}/run/holder.pid"
SELF="$(readlink -f "${BASH_SOURCE[0]}")"
readonly SELF
# The twin's name and tree, kept in the state directory so that later commands need neither.
TWIN_NAME="${DDP_E2E_TWIN:-$(cat "${STATE}/twin" 2>/dev/null || true)}"
TWIN_TREE="${DDP_E2E_TWIN_TREE:-$(cat "${STATE}/twin-tree" 2>/dev/null || true)}"
readonly TWIN_NAME TWIN_TREE
# The twin's uplink (a second network with the default route) is the next /24 unless given.
readonly UPLINK_SUBNET="${DDP_E2E_UPLINK_SUBNET:-${SUBNET_PREFIX%.*}.$((${SUBNET_PREFIX##*.} + 1))}"

# A plain cluster: nodeK on eth0, one partition e2e, GPU-node sizes; a twin file overrides these.
TWIN_NODE_NAMES=()
TWIN_INTERFACE=eth0
TWIN_EXTRA_INTERFACES=()
TWIN_EXTRA_SUBNETS=()      # per extra interface, a /24 whose .(2 + node index) it gets ("" or none: no address)
TWIN_UPLINK=""
TWIN_SELF_LOOPBACK=0
TWIN_NODE_SPEC="CPUs=144 RealMemory=512000 Features=gpu"
TWIN_PARTITIONS=("e2e Default=YES")
TWIN_GRES=()
TWIN_CONTAINER_COMMAND=""
if [ -n "${TWIN_NAME}" ]; then
    TWIN_FILE="$(dirname "${SELF}")/twins/${TWIN_NAME}.sh"
    [ -f "${TWIN_FILE}" ] || { printf 'cluster: error: DDP_E2E_TWIN=%s: no %s\n' "${TWIN_NAME}" "${TWIN_FILE}" >&2; exit 2; }
    # shellcheck source=/dev/null
    source "${TWIN_FILE}"
fi

cluster::log() {
    printf 'cluster: %s\n' "$*" >&2
}

cluster::err() {
    cluster::log "error: $*"
    exit 1
}

# Node i (from 1): its name as the cluster's up wrote it, its namespace and addresses.
cluster::node_name() { sed -n "${1}p" "${STATE}/node-names"; }
cluster::netns() { printf '%s-%s' "${PREFIX}" "$(cluster::node_name "$1")"; }
cluster::node_addr() { printf '%s.%d' "${SUBNET_PREFIX}" "$((10 + $1))"; }
cluster::uplink_addr() { printf '%s.%d' "${UPLINK_SUBNET}" "$((10 + $1))"; }

# The index of a node by its name, or an error naming the cluster's nodes.
cluster::node_index() {
    local -r name="$1"
    local index
    index="$(grep -nxF -- "${name}" "${STATE}/node-names" 2>/dev/null | cut -d: -f1)"
    [ -n "${index}" ] || cluster::err "'${name}' is not a node of this cluster ($(paste -sd' ' "${STATE}/node-names" 2>/dev/null || echo none))"
    printf '%s\n' "${index}"
}

# The first N node names: the twin's, else node1..nodeN.
cluster::write_node_names() {
    local -r nodes="$1"
    local i
    if [ "${#TWIN_NODE_NAMES[@]}" -gt 0 ] && [ "${nodes}" -gt "${#TWIN_NODE_NAMES[@]}" ]; then
        cluster::err "twin ${TWIN_NAME} has ${#TWIN_NODE_NAMES[@]} nodes, not ${nodes}"
    fi
    for ((i = 1; i <= nodes; i++)); do
        if [ "${#TWIN_NODE_NAMES[@]}" -gt 0 ]; then
            printf '%s\n' "${TWIN_NODE_NAMES[i - 1]}"
        else
            printf 'node%d\n' "${i}"
        fi
    done > "${STATE}/node-names"
}

cluster::node_count() {
    if [ -f "${STATE}/nodes" ]; then
        cat "${STATE}/nodes"
    else
        echo 0
    fi
}

cluster::pid_alive() {
    local -r pidfile="$1"
    [ -s "${pidfile}" ] && kill -0 "$(cat "${pidfile}")" 2>/dev/null
}

cluster::check_host() {
    [ "$(id -u)" -eq 0 ] || cluster::err "needs root (network namespaces, slurmd)"
    local cmd
    for cmd in ip unshare nsenter pivot_root mknod; do
        command -v "${cmd}" >/dev/null || cluster::err "${cmd} not found (apt-get install iproute2 util-linux)"
    done
    if [ -z "${ROOT_DIR}" ] || [ ! -x "${ROOT_DIR}/usr/sbin/slurmctld" ]; then
        cluster::err "DDP_E2E_ROOT='${ROOT_DIR}' is not a built root: run tests/e2e/apptainer_root.py build"
    fi
}

# Entered after `unshare -m --propagation private`: pivot_root into the root, then CMD.
cluster::enter_root() {
    local root="$1"
    shift
    if [ -n "${TWIN_NAME}" ]; then
        # The twin's own view of the shared root: its files over the root's, its changes (a
        # command it lacks, a bind's mount point) in the state directory.
        local -r layers="${STATE}/root"
        mkdir -p "${layers}/upper" "${layers}/work" "${layers}/merged"
        local lower="${root}"
        if [ -n "${TWIN_TREE}" ] && [ -d "${TWIN_TREE}/root" ]; then
            lower="${TWIN_TREE}/root:${root}"
        fi
        mount -t overlay overlay -o "lowerdir=${lower},upperdir=${layers}/upper,workdir=${layers}/work" "${layers}/merged"
        root="${layers}/merged"
    fi
    mount --bind "${root}" "${root}"
    mount -t proc proc "${root}/proc"
    mount --rbind /sys "${root}/sys"
    mount --rbind /dev "${root}/dev"
    local path
    local -a binds=(/tmp /var/tmp)
    IFS=: read -r -a extra <<< "${DDP_E2E_ROOT_BINDS:-}"
    for path in "${binds[@]}" "${extra[@]}"; do
        if [ -z "${path}" ] || [ ! -d "${path}" ]; then
            continue
        fi
        mkdir -p "${root}${path}"
        # The test user must reach a bound path through the root's own directories
        # (/root there is 0700 like here; a checkout under it is still readable).
        local dir="${path%/*}"
        while [ -n "${dir}" ]; do
            chmod o+x "${root}${dir}"
            dir="${dir%/*}"
        done
        mount --rbind "${path}" "${root}${path}"
    done
    # A private /dev/fuse (character device 10:229) that the test user may open.
    rm -f "${STATE}/run/fuse"
    mknod -m 0666 "${STATE}/run/fuse" c 10 229
    touch "${root}/dev/fuse" 2>/dev/null || true
    mount --bind "${STATE}/run/fuse" "${root}/dev/fuse"
    mount --bind "${STATE}/etc/hosts" "${root}/etc/hosts"
    mount --bind /etc/resolv.conf "${root}/etc/resolv.conf"
    cd "${root}"
    mkdir -p .oldroot
    pivot_root . .oldroot
    cd /
    umount -l /.oldroot
    [ -z "${TWIN_CONTAINER_COMMAND}" ] || cluster::only_container_command "${TWIN_CONTAINER_COMMAND}"
    exec "$@"
}

# The twin's site has one container command: singularity (SingularityCE) on LUMI, and no apptainer.
# Apptainer's own singularity command (Debian's apptainer package links it to apptainer) becomes
# a program of its own, and apptainer goes (an overlay whiteout: the shared root keeps it).
cluster::only_container_command() {
    local -r command="$1"
    case "${command}" in
        singularity) ;;
        *) cluster::err "twin ${TWIN_NAME}: TWIN_CONTAINER_COMMAND=${command} is not singularity, the one stand-in there is" ;;
    esac
    local -r program="$(readlink -f /usr/bin/apptainer)"
    cp --remove-destination "${program}" /usr/bin/singularity
    rm -f /usr/bin/apptainer
}

cluster::start_holder() {
    cluster::pid_alive "${HOLDER_PID}" && return 0
    setsid unshare --mount --propagation private "${SELF}" _enter "${ROOT_DIR}" sleep infinity \
        </dev/null >"${STATE}/log/holder.log" 2>&1 &
    echo "$!" > "${HOLDER_PID}"
    local n
    for ((n = 0; n < 100; n++)); do
        # .complete exists in the root only (tests/e2e/apptainer_root.py): pivot_root is done.
        [ -e "/proc/$(cat "${HOLDER_PID}")/root/.complete" ] && return 0
        sleep 0.1
    done
    cluster::err "the root's mount namespace did not come up: $(cat "${STATE}/log/holder.log")"
}

# CMD inside the root's mount namespace (the host's network and UTS namespaces).
cluster::in_root() {
    nsenter --target "$(cat "${HOLDER_PID}")" --mount --root --wd "$@"
}

cluster::write_config() {
    local -r nodes="$1"
    local -r hostname_s="$(hostname -s)"
    mkdir -p "${STATE}"/{etc,log,run,spool,ctld,munge}
    # The test user's clients reach munged's socket here (munged(8): the socket's
    # directory needs execute permission for all); the key stays 0600.
    chmod 0755 "${STATE}" "${STATE}/munge"
    echo "${nodes}" > "${STATE}/nodes"
    printf '%s\n' "${TWIN_NAME}" > "${STATE}/twin"
    printf '%s\n' "${TWIN_TREE}" > "${STATE}/twin-tree"
    printf '%s\n' "${TWIN_INTERFACE}" > "${STATE}/interface"
    cluster::write_node_names "${nodes}"

    # The cluster's names, as the login node (and slurmctld) resolve them.
    local -r cluster_hosts="$(
        local i
        for ((i = 1; i <= nodes; i++)); do
            printf '%s %s\n' "$(cluster::node_addr "${i}")" "$(cluster::node_name "${i}")"
        done
    )"
    printf '127.0.0.1 localhost\n%s %s\n%s\n' "${CONTROLLER_ADDR}" "${hostname_s}" "${cluster_hosts}" \
        > "${STATE}/etc/hosts"
    # Debian's installer puts the host's own name on 127.0.1.1 (Debian Reference, "The hostname
    # resolution", https://www.debian.org/doc/manuals/debian-reference/ch05.en.html#_the_hostname_resolution),
    # before the cluster's lines an administrator adds: each node then resolves itself to loopback.
    local i node
    for ((i = 1; i <= nodes; i++)); do
        node="$(cluster::node_name "${i}")"
        if [ "${TWIN_SELF_LOOPBACK}" = 1 ]; then
            printf '127.0.0.1 localhost\n127.0.1.1 %s\n%s %s\n%s\n' "${node}" "${CONTROLLER_ADDR}" "${hostname_s}" \
                "${cluster_hosts}" > "${STATE}/etc/hosts-${node}"
        else
            cp "${STATE}/etc/hosts" "${STATE}/etc/hosts-${node}"
        fi
    done

    cat > "${STATE}/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
EOF

    # cred_expire=10: a requeued job may start again after 10 s instead of 120 s
    # (the requeue tests' wait); it also bounds a step credential's lifetime.
    # config_overrides: nodes declare the size of a GPU node (144 CPUs, 500 GiB)
    # whatever this machine has, so the job scripts' own --cpus-per-task and --mem
    # lines fit unchanged; nothing enforces them (no cgroups, CR_CPU).
    cat > "${STATE}/etc/slurm.conf" <<EOF
ClusterName=${CLUSTER_NAME}
SlurmctldHost=${hostname_s}(${CONTROLLER_ADDR})
SlurmctldPort=${SLURMCTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${STATE}/munge/munge.socket,cred_expire=10
StateSaveLocation=${STATE}/ctld
SlurmctldPidFile=${STATE}/run/slurmctld.pid
SlurmctldLogFile=${STATE}/log/slurmctld.log
SlurmdSpoolDir=${STATE}/spool/%n
SlurmdPidFile=${STATE}/run/slurmd-%n.pid
SlurmdLogFile=${STATE}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=${STATE}/log/jobcomp.txt
ReturnToService=2
MinJobAge=3600
KillWait=5
SlurmdTimeout=60
InactiveLimit=0
JobRequeue=0
SlurmctldDebug=info
SlurmdDebug=info
EOF
    # The nodes: sized and featured as the twin's (a plain cluster's: Features=gpu, as MPCDF Raven
    # selects its GPU nodes by that feature, which SLURM refuses where no node has it; slurm.conf(5),
    # Features), their GPUs counted in Gres= and found through gres.conf.
    {
        if [ "${#TWIN_GRES[@]}" -gt 0 ]; then
            echo "GresTypes=gpu"
        fi
        for ((i = 1; i <= nodes; i++)); do
            node="$(cluster::node_name "${i}")"
            printf 'NodeName=%s NodeAddr=%s NodeHostname=%s %s State=UNKNOWN\n' \
                "${node}" "$(cluster::node_addr "${i}")" "${node}" "${TWIN_NODE_SPEC}"
        done
        local partition name options
        for partition in "${TWIN_PARTITIONS[@]}"; do
            read -r name options <<< "${partition}"
            printf 'PartitionName=%s Nodes=ALL MaxTime=INFINITE State=UP%s\n' "${name}" "${options:+ ${options}}"
        done
    } >> "${STATE}/etc/slurm.conf"
    # gres.conf(5): lines without NodeName= hold for every node that reads the file.
    printf '%s\n' "${TWIN_GRES[@]}" > "${STATE}/etc/gres.conf"
}

cluster::start_munge() {
    cluster::pid_alive "${STATE}/munge/munged.pid" && return 0
    [ -f "${STATE}/munge/munge.key" ] || mungekey --create --keyfile="${STATE}/munge/munge.key"
    chmod 0600 "${STATE}/munge/munge.key"
    chown -R root:root "${STATE}/munge"
    cluster::in_root munged --force \
        --socket="${STATE}/munge/munge.socket" \
        --key-file="${STATE}/munge/munge.key" \
        --pid-file="${STATE}/munge/munged.pid" \
        --seed-file="${STATE}/munge/munged.seed" \
        --log-file="${STATE}/log/munged.log"
}

cluster::start_network() {
    local -r nodes="$1"
    if ! ip link show "${BRIDGE}" >/dev/null 2>&1; then
        ip link add "${BRIDGE}" type bridge
        ip addr add "${CONTROLLER_ADDR}/24" dev "${BRIDGE}"
    fi
    ip link set "${BRIDGE}" up
    if [ -n "${TWIN_UPLINK}" ] && ! ip link show "${UPLINK_BRIDGE}" >/dev/null 2>&1; then
        ip link add "${UPLINK_BRIDGE}" type bridge
        ip addr add "${UPLINK_SUBNET}.1/24" dev "${UPLINK_BRIDGE}"
    fi
    [ -z "${TWIN_UPLINK}" ] || ip link set "${UPLINK_BRIDGE}" up
    local i ns veth extra
    for ((i = 1; i <= nodes; i++)); do
        ns="$(cluster::netns "${i}")"
        veth="${PREFIX}-v${i}"
        ip netns list | grep -qw "^${ns}" || ip netns add "${ns}"
        if ! ip link show "${veth}" >/dev/null 2>&1; then
            ip link add "${veth}" type veth peer name "${TWIN_INTERFACE}" netns "${ns}"
            ip link set "${veth}" master "${BRIDGE}" up
            ip -n "${ns}" addr add "$(cluster::node_addr "${i}")/24" dev "${TWIN_INTERFACE}"
        fi
        ip -n "${ns}" link set lo up
        ip -n "${ns}" link set "${TWIN_INTERFACE}" up
        # The node's other NICs: present and up, carrying nothing here (veths whose other end stays
        # down outside; this kernel may lack the dummy link type), with an address where the twin
        # gives their network one (RCP's RoCE network: the address its RDMA device's GIDs map).
        local k=0 subnet
        for extra in "${TWIN_EXTRA_INTERFACES[@]}"; do
            k=$((k + 1))
            if ! ip -n "${ns}" link show "${extra}" >/dev/null 2>&1; then
                ip link add "${PREFIX}-x${i}-${k}" type veth peer name "${extra}" netns "${ns}"
            fi
            ip -n "${ns}" link set "${extra}" up
            subnet="${TWIN_EXTRA_SUBNETS[$((k - 1))]:-}"
            [ -z "${subnet}" ] || ip -n "${ns}" addr replace "${subnet}.$((2 + i))/24" dev "${extra}"
        done
        # A second network, on its own subnet, with the node's default route.
        if [ -n "${TWIN_UPLINK}" ] && ! ip link show "${PREFIX}-u${i}" >/dev/null 2>&1; then
            ip link add "${PREFIX}-u${i}" type veth peer name "${TWIN_UPLINK}" netns "${ns}"
            ip link set "${PREFIX}-u${i}" master "${UPLINK_BRIDGE}" up
            ip -n "${ns}" addr add "$(cluster::uplink_addr "${i}")/24" dev "${TWIN_UPLINK}"
            ip -n "${ns}" link set "${TWIN_UPLINK}" up
            ip -n "${ns}" route add default via "${UPLINK_SUBNET}.1" dev "${TWIN_UPLINK}"
        fi
    done
}

cluster::start_slurmctld() {
    cluster::pid_alive "${STATE}/run/slurmctld.pid" && return 0
    cluster::in_root env SLURM_CONF="${STATE}/etc/slurm.conf" slurmctld -c -f "${STATE}/etc/slurm.conf"
}

# Entered inside the node's network namespace, after unshare --uts --mount.
cluster::node_main() {
    local -r node="$1"
    shift
    mount --bind "${STATE}/etc/hosts-${node}" /etc/hosts
    # The root's /sys is the host's (rbind): its /sys/class/net lists the host's interfaces. A
    # sysfs mounted from the node's network namespace lists the node's, as on a real node (sysfs
    # shows the net devices of the namespace that mounted it; `ip netns exec` remounts /sys the
    # same way, iproute2's lib/namespace.c netns_switch); the cgroup tree is kept.
    local -r cgroup="${STATE}/run/cgroup-${node}"
    mkdir -p "${cgroup}"
    mount --rbind /sys/fs/cgroup "${cgroup}"
    mount -t sysfs sysfs /sys
    mount --move "${cgroup}" /sys/fs/cgroup
    if [ -n "${TWIN_TREE}" ] && [ -d "${TWIN_TREE}/sys/class" ]; then
        mount -t overlay overlay -o "lowerdir=${TWIN_TREE}/sys/class:/sys/class" /sys/class
    fi
    if [ -n "${TWIN_TREE}" ] && [ -d "${TWIN_TREE}/dev" ]; then
        cluster::twin_dev "${node}"
    fi
    hostname "${node}"
    exec "$@"
}

# The twin's device files over the node's /dev (the host's, shared with every node), then the
# mounts that were below /dev (pts, shm, mqueue, the private fuse) again on top: an overlay shows
# the directory's own files, not what is mounted below it.
cluster::twin_dev() {
    local -r node="$1"
    local -r below="${STATE}/run/dev-${node}"
    mkdir -p "${below}"
    mount --rbind /dev "${below}"
    mount -t overlay overlay -o "lowerdir=${TWIN_TREE}/dev:${below}" /dev
    local target
    while read -r target; do
        [ "${target%/*}" = "${below}" ] || continue
        mount --rbind "${target}" "/dev/${target##*/}"
    done < <(findmnt -rn -o TARGET -R "${below}" | sort -u)
    umount -l "${below}"
}

cluster::start_slurmd() {
    local -r i="$1"
    local -r node="$(cluster::node_name "${i}")"
    cluster::pid_alive "${STATE}/run/slurmd-${node}.pid" && return 0
    mkdir -p "${STATE}/spool/${node}"
    nsenter --target "$(cat "${HOLDER_PID}")" --mount --root --wd --net="/run/netns/$(cluster::netns "${i}")" \
        unshare --uts --mount --propagation private \
        env SLURM_CONF="${STATE}/etc/slurm.conf" \
        "${SELF}" _node "${node}" slurmd -N "${node}" -f "${STATE}/etc/slurm.conf"
}

cluster::wait_idle() {
    local -r nodes="$1"
    local -r deadline=$((SECONDS + UP_TIMEOUT_S))
    local idle
    while ((SECONDS < deadline)); do
        idle="$(cluster::in_root env SLURM_CONF="${STATE}/etc/slurm.conf" sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)"
        if [ "${idle}" -ge "${nodes}" ]; then
            return 0
        fi
        sleep 0.2
    done
    cluster::err "nodes not idle after ${UP_TIMEOUT_S}s; see ${STATE}/log/"
}

cluster::up() {
    local -r nodes="${1:-2}"
    [[ "${nodes}" =~ ^[1-9][0-9]?$ ]] || cluster::err "node count '${nodes}' is not a number from 1 to 99"
    cluster::check_host
    if [ "$(cluster::node_count)" != 0 ] && [ "$(cluster::node_count)" != "${nodes}" ]; then
        cluster::log "resizing: tearing down the $(cluster::node_count)-node cluster first"
        cluster::down
    fi
    cluster::write_config "${nodes}"
    cluster::start_network "${nodes}"
    cluster::start_holder
    cluster::start_munge
    cluster::start_slurmctld
    local i
    for ((i = 1; i <= nodes; i++)); do
        cluster::start_slurmd "${i}"
    done
    cluster::wait_idle "${nodes}"
    cluster::log "up: ${nodes} nodes; export SLURM_CONF=${STATE}/etc/slurm.conf"
}

cluster::stop_pidfile() {
    local -r pidfile="$1"
    cluster::pid_alive "${pidfile}" || { rm -f "${pidfile}"; return 0; }
    local -r pid="$(cat "${pidfile}")"
    kill -TERM "${pid}" 2>/dev/null || true
    local n
    for ((n = 0; n < 50; n++)); do
        kill -0 "${pid}" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "${pid}" 2>/dev/null || true
    rm -f "${pidfile}"
}

# Job processes left in a node's namespace (a killed step, a hung worker).
# Every process of the node at once, as a node that dies loses them: all are stopped before any is
# killed. Killed one by one, a rank that outlived its node's first casualty by a few milliseconds on a
# loaded machine saw its peer's connection reset, and answered the roll call for a node that was gone.
cluster::kill_netns_procs() {
    local -r ns="$1"
    local -a pids
    mapfile -t pids < <(ip netns pids "${ns}" 2>/dev/null)
    ((${#pids[@]})) || return 0
    kill -STOP "${pids[@]}" 2>/dev/null || true
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

cluster::down() {
    [ "$(id -u)" -eq 0 ] || cluster::err "needs root"
    local pidfile
    for pidfile in "${STATE}"/run/slurmd-*.pid; do
        [ -e "${pidfile}" ] && cluster::stop_pidfile "${pidfile}"
    done
    cluster::stop_pidfile "${STATE}/run/slurmctld.pid"
    cluster::stop_pidfile "${STATE}/munge/munged.pid"
    cluster::stop_pidfile "${HOLDER_PID}"
    local ns i
    local -a namespaces=()
    if [ -s "${STATE}/node-names" ]; then
        for ((i = 1; i <= $(wc -l < "${STATE}/node-names"); i++)); do
            namespaces+=("$(cluster::netns "${i}")")
        done
    else
        mapfile -t namespaces < <(ip netns list | awk '{print $1}' | grep "^${PREFIX}-node" || true)
    fi
    for ns in "${namespaces[@]}"; do
        ip netns list | grep -qw "^${ns}" || continue
        cluster::kill_netns_procs "${ns}"
        ip netns del "${ns}"
    done
    ip link del "${BRIDGE}" 2>/dev/null || true
    ip link del "${UPLINK_BRIDGE}" 2>/dev/null || true
    rm -rf "${STATE}"
    cluster::log "down"
}

cluster::status() {
    local -r nodes="$(cluster::node_count)"
    if [ "${nodes}" = 0 ]; then
        echo "down"
        return 3
    fi
    echo "state: ${STATE} (${nodes} nodes)"
    echo "export SLURM_CONF=${STATE}/etc/slurm.conf"
    local name pidfile
    for pidfile in "${HOLDER_PID}" "${STATE}/munge/munged.pid" "${STATE}/run/slurmctld.pid" "${STATE}"/run/slurmd-*.pid; do
        name="$(basename "${pidfile}" .pid)"
        if cluster::pid_alive "${pidfile}"; then
            echo "${name}: running (pid $(cat "${pidfile}"))"
        else
            echo "${name}: not running"
        fi
    done
    cluster::in_root env SLURM_CONF="${STATE}/etc/slurm.conf" sinfo -N -o '%N %T %c' || true
}

# Run a command inside a node, in slurmd's own namespaces (network, UTS, mount).
cluster::exec() {
    local -r node="${1:?usage: cluster.sh exec NODE CMD...}"
    shift
    local -r pidfile="${STATE}/run/slurmd-${node}.pid"
    cluster::pid_alive "${pidfile}" || cluster::err "${node}: slurmd is not running"
    exec nsenter --target "$(cat "${pidfile}")" --net --uts --mount \
        env SLURM_CONF="${STATE}/etc/slurm.conf" "$@"
}

# A node that dies: its slurmd and every process in its namespace get SIGKILL, no cleanup.
cluster::crash_node() {
    local -r node="${1:?usage: cluster.sh crash NODE}"
    local i
    i="$(cluster::node_index "${node}")"
    local -r pidfile="${STATE}/run/slurmd-${node}.pid"
    if [ -s "${pidfile}" ]; then
        kill -KILL "$(cat "${pidfile}")" 2>/dev/null || true
        rm -f "${pidfile}"
    fi
    cluster::kill_netns_procs "$(cluster::netns "${i}")"
    cluster::log "${node}: crashed (slurmd and its processes killed)"
}

# The node back after a crash or a network drop: its link up, slurmd started, the node
# returned to service (ReturnToService=2 does it once slurmd registers; resume covers DOWN*).
cluster::revive_node() {
    local -r node="${1:?usage: cluster.sh revive NODE}"
    local i
    i="$(cluster::node_index "${node}")"
    ip -n "$(cluster::netns "${i}")" link set "${TWIN_INTERFACE}" up
    cluster::start_slurmd "${i}"
    local -r deadline=$((SECONDS + UP_TIMEOUT_S))
    local state
    while ((SECONDS < deadline)); do
        state="$(cluster::in_root env SLURM_CONF="${STATE}/etc/slurm.conf" sinfo -h -n "${node}" -o '%T' 2>/dev/null || true)"
        case "${state}" in
            idle | mixed | allocated) cluster::log "${node}: back (${state})"; return 0 ;;
            down* | drain* | fail*)
                cluster::in_root env SLURM_CONF="${STATE}/etc/slurm.conf" \
                    scontrol update nodename="${node}" state=resume 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    cluster::err "${node} not back after ${UP_TIMEOUT_S}s; see ${STATE}/log/"
}

main() {
    local -r cmd="${1:-}"
    shift || true
    case "${cmd}" in
        up) cluster::up "$@" ;;
        down) cluster::down ;;
        status) cluster::status ;;
        env) printf 'export SLURM_CONF=%s\n' "${STATE}/etc/slurm.conf" ;;
        nodes) cat "${STATE}/node-names" ;;
        exec) cluster::exec "$@" ;;
        run)
            cluster::pid_alive "${HOLDER_PID}" || cluster::err "the cluster is not up"
            cluster::in_root env SLURM_CONF="${STATE}/etc/slurm.conf" "$@"
            ;;
        crash) cluster::crash_node "$@" ;;
        revive) cluster::revive_node "$@" ;;
        _node) cluster::node_main "$@" ;;
        _enter) cluster::enter_root "$@" ;;
        *) cluster::err "usage: cluster.sh up [N] | down | status | env | nodes | exec NODE CMD... | run CMD... | crash NODE | revive NODE" ;;
    esac
}

main "$@"
