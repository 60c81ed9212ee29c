"""What ddp-launch and the trainer agree on: the DDP_* variables, exit codes and the dataset's files.
Which network NCCL chose, read from its log, is ddp_contract.nccl_log's.

Both packages import this one module, so a name or a code is written once. It runs
on login nodes too (the job scripts check the dataset with the node's python3, 3.6
on SLES 15), so it keeps to the standard library and Python 3.6 syntax; `make lint`
checks it with vermin (entrypoints/host-modules.txt).
"""

import os
from typing import Tuple

# -- exit codes (sysexits.h names) -------------------------------------------------------
EXIT_USAGE = 2      # a mistake the user can fix: one line on stderr, never retried
EXIT_REQUEUE = 75   # EX_TEMPFAIL: stopped on a signal after a checkpoint; requeue resumes it
EXIT_BAD_NODE = 76  # EX_PROTOCOL ("the remote system returned something not possible"): the fabric gate,
                    # the preflight or a lost node's roll call named a bad node; the job script requeues
                    # without it

def free_bytes(path: str) -> int:
    """Bytes this user may still write under path (statvfs(3) f_bavail; quotas are not visible here)."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


# -- variables the launcher sets for the workers -----------------------------------------
EXPECT_FABRIC_VAR = "DDP_EXPECT_FABRIC"     # slingshot | infiniband | ethernet: check NCCL's choice
REQUIRE_FABRIC_VAR = "DDP_REQUIRE_FABRIC"   # "1": a fallback to sockets is an error
LOG_DIR_VAR = "DDP_LAUNCH_LOG_DIR"          # where NCCL's log goes beside torchrun's
ENV_SOURCES_VAR = "DDP_ENV_SOURCES"         # JSON {name: "who: why"} of what the launcher set
# The job's identity, derived by the scheduler's module in ddp_launch/schedulers/ from that scheduler's
# own variables, so that nothing else reads them: the job (the same on every node, across its requeues
# and its containers' restarts) and this node's name in it (a SLURM node, a pod). The run-dir lock
# names its owner's job with JOB_ID_VAR; a user may set it where no scheduler says (it is kept).
JOB_ID_VAR = "DDP_JOB_ID"
NODE_NAME_VAR = "DDP_NODE_NAME"
# The index, among the GPUs this process sees, of its own: set where SLURM bound one GPU to each
# task (srun --gpus-per-task=1), whose LOCAL_RANK (torch's: its index on the node) is then no index
# into the one GPU it sees. Unset: the process's GPU is its LOCAL_RANK.
TASK_DEVICE_VAR = "DDP_TASK_DEVICE"

# -- the fabric gate (src/ddp_train/gate/run.py) and the quarantine (ddp_contract/quarantine.py) --
# In the run dir: a stop asked for by the job script, which alone gets the time-limit signal
# (sbatch --signal=B:USR2@T). It holds the signal's name; the trainer stops as on that signal.
STOP_REQUEST_FILE = ".ddp-stop-request"

# The doctor checks that judge a node's own hardware (ddp-launch doctor's "gpu health": ECC, row
# remapping, throttling, temperature). A FAIL there on the only node of a job is that node's,
# not the setup's (ddp_contract.quarantine.setup_problem).
HARDWARE_CHECKS = ("gpu health",)
# In the run dir: the nodes a failed collective's roll call found gone (src/ddp_train/safety/peers.py writes
# it, ddp_contract.quarantine reads it: `add --by roll-call`). Only a lost node makes one: a worker
# killed on a live node does not.
ROLL_CALL_REPORT = "roll-call.json"
# In the run dir: written by a node's ddp-launch (its torchrun agent, ddp_launch/agent.py) when its own
# workers were killed by a signal (not when they exited on their own: a node cut off the network
# ends its ranks with exit 1), or when it stopped the step with a line of its own (a usage error:
# ddp_contract.launcher_reports, which the other nodes read to name it). Every worker of a node killed at
# once is silent in the roll call as a lost node's are, but a node whose launcher lived to say so is up:
# the quarantine reads these and leaves such a node out (a crash, not a lost node). The job script
# removes them before each step.
LAUNCHER_CRASH_REPORT = "launcher-crash-{node}.json"
# Set by the job script for a training step that replaces nodes with spares (ddp_contract.spares):
# JSON with the nodes swapped and the fault's times; the trainer records the recovery from it.
RECOVERY_VAR = "DDP_RECOVERY"
# Set by ddp-launch's torchrun agent for its workers: when it started torchrun (its rendezvous), in
# seconds since the epoch; a recovery record measures the rendezvous from it.
RENDEZVOUS_STARTED_VAR = "DDP_RENDEZVOUS_STARTED_AT"
# Test-only: "HOST:LOCAL_RANK:COUNT" makes that rank add 1 to COUNT elements of its gate contribution.
GATE_TEST_CORRUPT_VAR = "DDP_GATE_TEST_CORRUPT"

# -- CIFAR-100 on disk (torchvision's layout) -------------------------------------------
DATASET_DIRNAME = "cifar-100-python"
DATASET_FILES = ("train", "test", "meta")


def missing_dataset_files(data_dir: str) -> Tuple[str, ...]:
    """The CIFAR-100 files absent under data_dir/cifar-100-python (empty when it is all there)."""
    folder = os.path.join(data_dir, DATASET_DIRNAME)
    return tuple(name for name in DATASET_FILES if not os.path.isfile(os.path.join(folder, name)))
