"""Launcher faults on the real cluster: a worker node whose head never comes up gives up in time."""
import time

import pytest

pytestmark = pytest.mark.e2e


def test_a_node_whose_head_never_starts_gives_up_within_the_rendezvous_timeout(cluster, tmp_path):
    # The head (node 0) never starts its launcher: node 1 keeps connecting to a port where
    # nothing listens. Its wait was bounded by a 300 s store timeout, twice, not by the
    # rendezvous timeout, and ended in C++ stack traces.
    script = tmp_path / "head-missing.sh"
    script.write_text("#!/bin/bash\nif [ \"$SLURM_NODEID\" = 0 ]; then sleep 300; fi\n"
                      "exec ddp-launch --cpu-workers 1 --script tests/e2e/workloads/allreduce.py\n")
    script.chmod(0o755)
    started = time.monotonic()

    done = cluster.run(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", str(script)],
                       env={"DDP_LAUNCH_RDZV_TIMEOUT": "10"}, timeout=150)

    assert done.returncode != 0
    assert time.monotonic() - started < 60
    assert "ddp-launch: error: rendezvous store at 10.77.0.11:" in done.stderr
    assert "frame #" not in done.stderr and "Traceback" not in done.stderr
