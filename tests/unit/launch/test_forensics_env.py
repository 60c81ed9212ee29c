"""The Flight Recorder settings a plan adds only where the user set none, and who set each variable."""

from __future__ import annotations

import json

from ddp_launch.forensics import env_sources, flight_recorder_env
from ddp_launch.plan import FABRIC_DEFAULT, SITE_PROFILE, EnvChange, LaunchPlan


def names(changes) -> dict[str, str]:
    return {c.name: c.value for c in changes}


def test_the_flight_recorder_is_turned_on_where_nothing_is_set():
    # https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html: a buffer size
    # above 0 enables it; NCCL dumps on a timeout with TORCH_NCCL_DUMP_ON_TIMEOUT=1.
    assert names(flight_recorder_env({})) == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                                              "TORCH_NCCL_ENABLE_MONITORING": "1"}


def test_a_buffer_size_under_either_name_is_the_users_and_kept():
    # torch 2.14 reads TORCH_FR_BUFFER_SIZE, then TORCH_NCCL_TRACE_BUFFER_SIZE (FlightRecorder.hpp).
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        assert "TORCH_FR_BUFFER_SIZE" not in names(flight_recorder_env({name: "0"}))


def test_a_user_who_turned_the_dump_off_keeps_it_off():
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in names(flight_recorder_env({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}))


def test_each_planned_variable_says_who_set_it_and_why():
    plan = LaunchPlan(mode="local", argv=("python",), changes=(
        EnvChange("OMP_NUM_THREADS", "4", "cores / workers"), EnvChange("RANK", None, "removed"),
        EnvChange("NCCL_PROTO", "^LL128", "GH200: nccl#2001", FABRIC_DEFAULT),
        EnvChange("CPATH", "/opt/libfabric/include", "site olivia: host libfabric headers", SITE_PROFILE)))
    sources = json.loads(env_sources(plan))
    assert sources == {"OMP_NUM_THREADS": "launcher: cores / workers",
                       "NCCL_PROTO": "fabric default: GH200: nccl#2001",
                       "CPATH": "site profile: site olivia: host libfabric headers"}
