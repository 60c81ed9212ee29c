"""Rank and world from torchrun's variables; a world of one without them."""

import pytest

from ddp_train.distributed import DistEnv
from ddp_train.errors import TrainError

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}


def test_no_variables_is_a_world_of_one():
    assert DistEnv.from_env({}) == DistEnv(0, 1, 0, 1)


def test_torchrun_variables_are_read():
    assert DistEnv.from_env(TORCHRUN) == DistEnv(3, 8, 1, 4)


def test_a_bound_tasks_device_is_read_beside_torchs_local_rank():
    assert DistEnv.from_env({**TORCHRUN, "DDP_TASK_DEVICE": "0"}) == DistEnv(3, 8, 1, 4, task_device=0)


@pytest.mark.parametrize("change,message", [
    ({"RANK": None}, "RANK is not set"),
    ({"WORLD_SIZE": "eight"}, "WORLD_SIZE='eight' is not an integer"),
    ({"RANK": "8"}, "inconsistent ranks"),
    ({"MASTER_ADDR": None}, "MASTER_ADDR is not set"),
    ({"DDP_TASK_DEVICE": "gpu0"}, "DDP_TASK_DEVICE='gpu0' is not an integer"),
    ({"DDP_TASK_DEVICE": "-1"}, "DDP_TASK_DEVICE='-1' is not a device index"),
])
def test_broken_launch_environment_is_named(change, message):
    env = {k: v for k, v in {**TORCHRUN, **change}.items() if v is not None}
    with pytest.raises(TrainError, match=message):
        DistEnv.from_env(env)
