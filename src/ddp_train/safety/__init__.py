"""The trainer's safety nets: what lets a run stop, hang, lose a node or be replaced without losing
work, and say afterwards what ran.

- signals: stop requests (SIGUSR2, SIGUSR1, SIGTERM, the stop file) -> checkpoint and exit 75.
- heartbeat: the heartbeat the node's agent watches, and the stacks and flight recorder on a hang.
- steptime: each rank's compute and all-reduce wait per step; stragglers named.
- peers: the roll call that names the node gone when a collective fails.
- rundir: the run directory checked before training (writable, room, one job at a time).
The run's manifest (image, libraries, environment) is ddp_contract.provenance's: a user's own workload
gets one too, from the launcher's worker.

Nothing here is imported by this file: `from ddp_train.safety import peers` loads peers alone.
"""
