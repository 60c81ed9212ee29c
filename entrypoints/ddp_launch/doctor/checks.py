"""Every check of the node preflight, in the order the report prints them: adding a check is
writing it in its subject's module and naming it here."""

from __future__ import annotations

from typing import Callable, Sequence, Tuple, Union

from ddp_launch.doctor.context import DoctorContext
from ddp_launch.doctor.fabric import check_fabric_devices, check_fabric_settings, check_fi_info
from ddp_launch.doctor.gpu import check_cuda_driver, check_gpu_health, check_gpus, check_torch
from ddp_launch.doctor.known_issues import check_known_issues
from ddp_launch.doctor.nccl_conf import check_nccl_conf
from ddp_launch.doctor.launch_plan import check_launch_plan
from ddp_launch.doctor.libraries import check_host_libraries, check_library_dependencies
from ddp_launch.doctor.network import check_head_node, check_interface
from ddp_launch.doctor.report import Check
from ddp_launch.doctor.storage import check_dataset, check_image_mount, check_shm, check_workload

# A check returns one Check, or one per item it looks at (check_host_libraries: one per library).
CheckFunction = Callable[[DoctorContext], Union[Check, Tuple[Check, ...]]]

CHECKS: Tuple[CheckFunction, ...] = (
    check_launch_plan,
    check_image_mount,
    check_gpus,
    check_gpu_health,
    check_torch,
    check_cuda_driver,
    check_fabric_devices,
    check_fabric_settings,
    check_host_libraries,
    check_library_dependencies,
    check_fi_info,
    check_nccl_conf,
    check_known_issues,
    check_interface,
    check_head_node,
    check_shm,
    check_workload,
    check_dataset,
)


def run_checks(ctx: DoctorContext, checks: Sequence[CheckFunction] = CHECKS) -> Tuple[Check, ...]:
    found = []
    for check in checks:
        result = check(ctx)
        found.extend(result if isinstance(result, tuple) else (result,))
    return tuple(found)
