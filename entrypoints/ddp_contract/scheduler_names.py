"""The scheduler variables read outside ddp_launch/schedulers/: the job, the node, the GPUs granted.

The scheduler modules own every other name and build their tables on these. These few live in
the contract because their readers cannot import the scheduler modules: the trainer (the roll
call's node names, where ddp-launch's DDP_NODE_NAME is missing) never imports the launcher, and
gpus.py, which the scheduler modules call, would close an import cycle with them. The run-dir lock
reads none of them: the job's identity reaches it as DDP_JOB_ID (ddp_launch/job_identity.py).
Python 3.6, standard library.
"""

# SLURM: sbatch(1) and srun(1), "OUTPUT ENVIRONMENT VARIABLES" (https://slurm.schedmd.com/sbatch.html).
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURMD_NODENAME = "SLURMD_NODENAME"             # this node's name as SLURM knows it (srun sets it per task)
SLURM_GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"       # GPUs granted on this node: "4"
SLURM_GPUS_PER_NODE = "SLURM_GPUS_PER_NODE"     # --gpus-per-node as asked: "gpu:a100:4"
SLURM_JOB_GPUS = "SLURM_JOB_GPUS"               # the node's own IDs of the job's GPUs: "0,1,2,3"
SLURM_STEP_GPUS = "SLURM_STEP_GPUS"             # the same for this step's GPUs (not the batch step's)
SLURM_JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"     # the job's node count, spares included (ddp_contract.spares)
# srun reads it as --network (srun(1), INPUT ENVIRONMENT VARIABLES), and slurm/lib/ddp.sh puts the site
# profile's --network into a step's environment under it, where the tasks see it (the fabric defaults).
SLURM_NETWORK = "SLURM_NETWORK"

# RunAI: the variables it sets in a workload's pods (https://docs.run.ai, "Environment variables").
RUNAI_JOB_NAME = "RUNAI_JOB_NAME"
RUNAI_NUM_OF_GPUS = "RUNAI_NUM_OF_GPUS"         # GPUs granted to the pod: "4"

# What names the job where a file is named after it (NCCL's log): the first one set.
JOB_NAME_VARIABLES = (SLURM_JOB_ID, RUNAI_JOB_NAME)
