"""How ddp-launch starts torchrun: its command line, restarts, per-node log dirs, and the variables they need.

torchrun is started as `<this python> -m ddp_launch.agent` (torch.distributed.run
with our exit codes and stop signals), not the
`torchrun` on PATH: images often carry several interpreters (NGC: /usr/bin and
/usr/local/bin; the Olivia guide's job script hard-codes TORCHRUN_PATH for that reason), and
the workers must run the same interpreter, torch and packages as the launcher.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch.envvars import Setting, integer
from ddp_launch.errors import LaunchError
from ddp_launch.launch_options import LaunchOptions, Workload
from ddp_launch.plan import EnvChange

# ddp_launch.agent is torch.distributed.run plus exit codes and signal forwarding (agent.py).
TORCHRUN_MODULE = "ddp_launch.agent"

# c10d's store read/connect timeout defaults to 60 s. A node whose container
# starts sooner than the head's (cold squashfs cache, a Kubernetes image pull)
# keeps retrying the head's store until it runs out, so it follows the join
# timeout: half of it, because TCPStore's client makes one more connect attempt
# of the full timeout after its deadline (torch 2.14, measured: read_timeout=5
# gives up after 10 s). So a node whose head never comes up gives up within the
# join timeout, like every other rendezvous wait: 300 s for torchrun's 600 s.
TORCHRUN_JOIN_TIMEOUT_S = 600


def store_read_timeout(join_timeout_s: int | None) -> int:
    return max(1, (join_timeout_s or TORCHRUN_JOIN_TIMEOUT_S) // 2)


# "node2:rank5: ..." finds rank 5 on node 2 (see log_line_prefix).
LOG_PREFIX_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


# The job's own rendezvous settings (Kubeflow's elasticPolicy.rdzvConf reaches the pods as this).
# torchrun reads it only when --rdzv-conf is not given (torch/distributed/argparse_util.py: the
# flag beats PET_*), and ddp-launch always gives the flag, so the job's keys are merged into it.
RDZV_CONF_VAR = "PET_RDZV_CONF"


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int
    run_id: str
    is_host: bool | None                # None: torchrun matches the host against this machine itself
    join_timeout_s: int | None = None   # None: torchrun's own (600 s)
    job_conf: tuple[tuple[str, str], ...] = ()   # the job's PET_RDZV_CONF, in its order


def job_rdzv_conf(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """PET_RDZV_CONF as torchrun parses it (key=value,...; _parse_rendezvous_config in
    torch/distributed/elastic/rendezvous/utils.py), or a LaunchError naming it."""
    text = env.get(RDZV_CONF_VAR, "").strip()
    pairs = []
    for item in text.split(",") if text else ():
        key, equals, value = item.partition("=")
        if not key.strip() or not value.strip():
            raise LaunchError(f"{RDZV_CONF_VAR}={text!r} is not key=value,key=value (torchrun's --rdzv-conf): "
                              f"fix the job's rendezvous configuration (Kubeflow: elasticPolicy.rdzvConf)")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def join_timeout(options: LaunchOptions, job_conf: tuple[tuple[str, str], ...] = ()) -> int | None:
    """--rdzv-timeout / DDP_LAUNCH_RDZV_TIMEOUT, else the job's join_timeout, else None (torchrun's)."""
    if options.rdzv_timeout is not None:
        return int(options.rdzv_timeout.value)
    job = dict(job_conf).get("join_timeout")
    return None if job is None else integer(f"{RDZV_CONF_VAR} join_timeout", job, 1,
                                            fix="give the seconds torchrun waits for the nodes to join")


def max_restarts(options: LaunchOptions, scheduler: Setting | None = None) -> int:
    """Worker-group restarts: --max-restarts / DDP_LAUNCH_MAX_RESTARTS > the scheduler's value > 0."""
    if options.max_restarts is not None:
        return int(options.max_restarts.value)
    if scheduler is not None:
        return integer(scheduler.source, scheduler.value, fix="fix it or pass --max-restarts N")
    return 0


def node_log_dir(log_dir: str | None, node: str | None) -> str | None:
    """<log_dir>/<node>: every node of a job writes its workers' logs under its own name."""
    if not log_dir or not node:
        return log_dir
    return f"{log_dir.rstrip('/')}/{node}"


def log_line_prefix(node: str | None) -> str:
    """torchrun's per-line template with this node's name filled in by us.

    Older torchrun (2.2 to 2.13, and NGC images carry such) substitutes only
    ${role_name}, ${rank} and ${local_rank}; the node is known here, at plan time.
    """
    return f"{node}:rank${{rank}}: " if node else "rank${rank}: "


# What tells torchrun not to share its rendezvous store with the workers (torch's dynamic_rendezvous,
# use_agent_store): rank 0 then hosts a store of its own at MASTER_ADDR:MASTER_PORT, as env:// does without
# torchrun (torch.distributed.init_process_group, "env://": rank 0 starts the TCPStore server).
SEPARATE_STORE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def torchrun_env(env: Mapping[str, str], restarts: int, log_dir: str | None,
                 node: str | None = None, workload: Workload | None = None) -> tuple[EnvChange, ...]:
    """The variables torchrun needs for --log-dir and --max-restarts to work as the plan says, and a user's
    workload for its own MASTER_ADDR/MASTER_PORT."""
    changes = []
    if log_dir and LOG_PREFIX_VAR not in env:
        # The variable, not torchrun's --log-line-prefix-template flag: the flag is new
        # (torch 2.13 takes it for the script name), while torchrun reads the variable
        # since 2.2.
        changes.append(EnvChange(LOG_PREFIX_VAR, log_line_prefix(node),
                                 "--log-dir: each console line names its node and global rank"))
    if SEPARATE_STORE_VAR in env:
        return tuple(changes)
    if restarts > 0:
        # torchrun shares its rendezvous store with the workers by default, and
        # the keys of a failed round stay in it: restarted workers read their
        # dead peers' gloo/NCCL addresses and fail to connect (pytorch#135712,
        # #167288). A store per round, hosted by rank 0, makes restarts work.
        changes.append(EnvChange(SEPARATE_STORE_VAR, "1",
                                 f"--max-restarts {restarts}: a fresh store per restart round "
                                 f"(pytorch#135712)"))
    elif workload is not None and not workload.is_ours:
        # A shared store tells the workers TORCHELASTIC_USE_AGENT_STORE=True, and env:// then makes every rank
        # a client of a store at MASTER_ADDR:MASTER_PORT (torch.distributed.rendezvous, _create_c10d_store):
        # a script that sets its own MASTER_PORT, as scripts written for srun do, would wait for a store that
        # nobody hosts. With a store of rank 0's own, its values work as they do under srun.
        changes.append(EnvChange(SEPARATE_STORE_VAR, "1",
                                 f"{workload.describe()}: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT, "
                                 f"as env:// does without torchrun, so a script's own MASTER_PORT works"))
    return tuple(changes)


def rdzv_conf(rendezvous: Rendezvous) -> str:
    """--rdzv-conf: is_host (ours: each node's own), read_timeout (the job's, else half the join
    timeout), join_timeout (--rdzv-timeout, else the job's), then the job's other keys as given.
    A job's is_host is dropped: the operator gives every pod the same PET_RDZV_CONF, so it would
    make every pod the host or none."""
    job = dict(rendezvous.job_conf)
    ours = {}
    if rendezvous.is_host is not None:
        ours["is_host"] = "true" if rendezvous.is_host else "false"
    ours["read_timeout"] = job.get("read_timeout", str(store_read_timeout(rendezvous.join_timeout_s)))
    if rendezvous.join_timeout_s is not None:
        ours["join_timeout"] = str(rendezvous.join_timeout_s)
    merged = {**ours, **{key: value for key, value in job.items() if key not in ours and key != "is_host"}}
    return ",".join(f"{key}={value}" for key, value in merged.items())


def endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def torchrun_command(
    python: str,
    nnodes: str,
    nproc: int,
    rendezvous: Rendezvous | None,
    restarts: int,
    log_dir: str | None,
    workload: Workload,
) -> tuple[str, ...]:
    """torchrun's argv; rendezvous None means --standalone (one node, store on a free port)."""
    argv = [python, "-m", TORCHRUN_MODULE]
    if rendezvous is None:
        argv += ["--standalone", "--nnodes=1"]
    else:
        argv += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint(rendezvous.host, rendezvous.port)}",
            f"--rdzv-id={rendezvous.run_id}",
            # Explicit is_host: torchrun's hostname/IP matching guesses wrong in
            # containers and behind NAT (pytorch#73656, #79388), so no guessing.
            f"--rdzv-conf={rdzv_conf(rendezvous)}",
        ]
    argv += [f"--nproc-per-node={nproc}", f"--max-restarts={restarts}"]
    if log_dir:
        # --log-dir alone writes only error files: --tee=3 writes every worker's
        # stdout and stderr there as well and keeps them on the console, where
        # each line names its host and global rank.
        argv += [f"--log-dir={log_dir}", "--tee=3"]
    argv += workload.torchrun_args()
    return tuple(argv)
