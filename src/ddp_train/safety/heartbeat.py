"""The trainer's heartbeat for its node's agent, and its hang forensics: ddp_contract.worker_heartbeat's,
which a user's own script takes part in through ddp_contract.workload."""

from ddp_contract.worker_heartbeat import (FORENSICS_VAR, FR_DUMP_VARS, REQUEST_POLL_S, STACKS_SIGNAL, Forensics,
                                           Heartbeat, dump_flight_recorder, stall_after_s,
                                           use_run_dir_for_flight_recorder, wanted)

__all__ = ["FORENSICS_VAR", "FR_DUMP_VARS", "REQUEST_POLL_S", "STACKS_SIGNAL", "Forensics", "Heartbeat",
           "dump_flight_recorder", "stall_after_s", "use_run_dir_for_flight_recorder", "wanted"]
