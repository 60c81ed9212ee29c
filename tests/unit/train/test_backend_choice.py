"""--backend: gloo trains on GPUs as well as on CPU; nccl is refused where it has no collectives.

The rule is the torch.distributed backend table
(https://pytorch.org/docs/stable/distributed.html#backends): gloo has broadcast and all_reduce
for CUDA tensors (all DDP's gradient sync needs), NCCL has no CPU collectives at all.
"""

from __future__ import annotations

import json

import pytest
import torch

from train_helpers import TINY_ARGS, run_trainer
from test_transport_check import CUDA, SOCKETS_LOG, fabric_env
from ddp_train import distributed
from ddp_train.config import config_from_args
from ddp_train.resolve import resolve_backend
from ddp_train.errors import TrainError


@pytest.mark.parametrize("requested,device,expected", [
    ("auto", "cuda", "nccl"),
    ("auto", "cpu", "gloo"),
    ("gloo", "cuda", "gloo"),  # the Ethernet cluster's Gloo variant, on its GPU nodes
    ("gloo", "cpu", "gloo"),
    ("nccl", "cuda", "nccl"),
])
def test_backend_follows_the_flag_and_the_device(requested, device, expected):
    assert resolve_backend(requested, device) == expected


def test_nccl_on_cpu_is_a_one_line_error_naming_gloo():
    with pytest.raises(TrainError, match="--backend nccl needs CUDA GPUs.*use --backend gloo"):
        resolve_backend("nccl", "cpu")


def test_the_flag_defaults_to_auto_and_rejects_other_backends():
    assert config_from_args([]).backend == "auto"
    assert config_from_args(["--backend", "gloo"]).backend == "gloo"
    with pytest.raises(TrainError, match="--backend"):
        config_from_args(["--backend", "mpi"])


@pytest.mark.parametrize("backend,device_id", [("gloo", False), ("nccl", True)])
def test_gloo_on_a_gpu_gets_no_nccl_device_binding(monkeypatch, backend, device_id):
    # device_id= makes init_process_group bind an NCCL communicator to the GPU eagerly; a gloo
    # group has none to bind (the call is recorded, no process group is made).
    calls = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: calls.append(kw))
    world = distributed.DistEnv(rank=0, world_size=2)
    distributed.init_process_group(world, torch.device("cuda", 0), 30, backend)
    assert calls[0]["backend"] == backend
    assert ("device_id" in calls[0]) is device_id


def test_gloo_on_gpus_skips_the_nccl_transport_check(tmp_path):
    # With gloo NCCL writes no log, so a stale or absent one must not be read as a sockets fallback.
    env = fabric_env(tmp_path, SOCKETS_LOG, DDP_REQUIRE_FABRIC="1")
    assert distributed.check_network_transport(env, CUDA, "gloo") is None
    with pytest.raises(TrainError):
        distributed.check_network_transport(env, CUDA, "nccl")


def test_nccl_requested_on_cpu_exits_2_in_one_line(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--backend", "nccl"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ddp-train: error: --backend nccl needs CUDA GPUs (NCCL has no CPU collectives) and this run is "
        "on the CPU: use --backend gloo, or run on GPU nodes (apptainer run --nv)"]


def test_two_ranks_train_with_an_explicit_gloo_backend_and_record_it(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "1", "--limit-train", "256", "--backend", "gloo"], torchrun_nproc=2)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    run = next(r for r in records if r["type"] == "run")
    assert run["config"]["backend"] == "gloo"
    summary = next(r for r in records if r["type"] == "summary")
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
