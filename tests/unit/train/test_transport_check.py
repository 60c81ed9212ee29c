"""The trainer's 'never silently on sockets' check, fed real-format NCCL log files."""

from __future__ import annotations

import os

import pytest
import torch

from ddp_train.distributed import check_network_transport
from ddp_train.errors import TrainError

SOCKETS_LOG = (
    "nid001:1234:1234 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)\n"
    "nid001:1234:1234 [0] NCCL INFO NET/Plugin: Using internal network plugin.\n"
    "nid001:1234:1234 [0] NCCL INFO Using network Socket\n"
)
FABRIC_LOG = (
    "nid001:1234:1234 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v9)\n"
    "nid001:1234:1234 [0] NCCL INFO Using network AWS Libfabric\n"
)
CUDA = torch.device("cuda")  # a device object only: nothing runs on it in these tests


def fabric_env(tmp_path, log_text: str, **extra: str) -> dict[str, str]:
    (tmp_path / f"nccl.{os.uname().nodename.split('.')[0]}.{os.getpid()}.log").write_text(log_text)
    return {"DDP_EXPECT_FABRIC": "slingshot", "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log"), **extra}


def test_a_sockets_fallback_is_a_loud_warning(tmp_path):
    message = check_network_transport(fabric_env(tmp_path, SOCKETS_LOG), CUDA)
    assert message is not None and "TCP sockets" in message and "WARNING" in message


def test_a_sockets_fallback_under_require_fabric_stops_the_run(tmp_path):
    with pytest.raises(TrainError, match="require-fabric"):
        check_network_transport(fabric_env(tmp_path, SOCKETS_LOG, DDP_REQUIRE_FABRIC="1"), CUDA)


def test_the_fabric_transport_passes_under_require_fabric(tmp_path):
    message = check_network_transport(fabric_env(tmp_path, FABRIC_LOG, DDP_REQUIRE_FABRIC="1"), CUDA)
    assert message is not None and "AWS Libfabric" in message and "WARNING" not in message


def test_nothing_is_checked_on_cpu_or_without_an_expected_fabric(tmp_path):
    env = fabric_env(tmp_path, SOCKETS_LOG, DDP_REQUIRE_FABRIC="1")
    assert check_network_transport(env, torch.device("cpu")) is None
    assert check_network_transport({k: v for k, v in env.items() if k != "DDP_EXPECT_FABRIC"}, CUDA) is None
