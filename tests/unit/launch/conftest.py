"""pytest fixtures for the launcher tests (plain environment dicts live in launch_envs.py)."""

import pytest


@pytest.fixture
def fake_dev(tmp_path):
    """A fake filesystem root with /dev/nvidia0..3 plus the control nodes that must not count."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        (dev / name).touch()
    return tmp_path


@pytest.fixture(autouse=True)
def cuda_driver_usable(monkeypatch):
    """The launcher's CUDA probe answers "usable" unless a test says otherwise, so a plan
    for a GPU node is the same on this CPU machine and on a GPU one."""
    from ddp_launch import gpus

    monkeypatch.setattr(gpus, "probe_driver", lambda accelerator: None)
