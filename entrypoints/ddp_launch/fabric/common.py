"""What the fabric modules share: the request they plan for, what their rules read (FabricJob), the
shape every fabric module has (Fabric), and EnvBuilder, which sets a default only where nothing set the
variable yet and keeps a typed finding for each value of the user's that was kept over a default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ddp_launch.fabric.defaults import FabricDefaults
from ddp_launch.facts import NodeFacts, Resolved
from ddp_launch.gpus import GrantVariables
from ddp_launch.plan import FABRIC_DEFAULT, EnvChange, Finding
from ddp_launch.sites import SiteProfile


@dataclass(frozen=True)
class FabricRequest:
    env: Mapping[str, str]              # the environment the launcher was started with
    multi_node: bool                    # more than one node in this job step
    head_address: str | None = None     # rendezvous host, for route-based interface choice
    head_ipv4: str | None = None        # its IPv4 address, when known (the route is to this)
    peer: Resolved | None = None        # another node's lookup, where the head's name is loopback here
    nccl_debug: str | None = None       # --nccl-debug LEVEL
    require_fabric: bool = False        # --require-fabric
    gloo: bool = False                  # CPU workers: gloo over TCP, whatever the node's HCAs
    log_dir: str | None = None          # --log-dir: NCCL's log goes beside torchrun's
    job_name: str | None = None         # the job in NCCL's log's name (the scheduler's JobIdentity.file_name)
    gpu_grant: GrantVariables = GrantVariables()   # the scheduler's GPU variables (its GPU_GRANT)


@dataclass(frozen=True)
class FabricJob:
    """What a fabric's rules read: the request, the node, the site profile and the fabric's own defaults."""

    request: FabricRequest
    facts: NodeFacts
    profile: SiteProfile | None
    defaults: FabricDefaults | None     # containers/sites/fabrics/<NAME>.json; None: the fabric has none
    conditions: Mapping[str, object]    # what a default's "when" may ask (fabric/defaults.py: CONDITIONS, FACTS)


class Fabric(Protocol):
    """One fabric: a module of this package (slingshot.py, infiniband.py, ethernet.py), named in
    ddp_contract.fabrics.FABRICS in the order detection tries them. plan_fabric and the doctor read
    these and never ask which fabric they have."""

    NAME: str               # as site profiles, DDP_EXPECT_FABRIC and its defaults' file name it
    TITLE: str              # as messages name it: "Slingshot"
    HIGH_SPEED: bool        # an RDMA fabric: --require-fabric wants one, the trainer warns when NCCL leaves it
    HAS_DEFAULTS: bool      # containers/sites/fabrics/<NAME>.json holds its values
    DEVICES: tuple[str, ...]    # where a node shows it ("/dev/cxi*"), for the messages that say it is absent
    NCCL_IB_TRANSPORT: bool     # NCCL reaches it through its IB verbs transport, which NCCL_IB_DISABLE=1 turns off
    LIBFABRIC_PROVIDER: str | None  # the provider `fi_info -p` must open (doctor), where NCCL goes through libfabric
    MISSING: str            # doctor's words when it is expected and the node lacks it; {found}: the devices there are
    MISSING_FIX: str        # and what to do about it
    MISSING_FIX_IN_A_POD: str  # the same, said where the doctor runs in a RunAI/Kubeflow pod

    def detect(self, facts: NodeFacts) -> bool:
        """Whether this node has it."""

    def plan(self, builder: EnvBuilder, job: FabricJob) -> None:
        """Its variables, after the site profile's and before common.json's (plan_fabric)."""


@dataclass
class EnvBuilder:
    """Collects changes for variables the user has not set, and findings for --dry-run and doctor."""

    env: Mapping[str, str]
    changes: list[EnvChange] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    withheld: dict[str, str] = field(default_factory=dict)   # variables a site leaves unset: why

    def planned(self, name: str) -> str | None:
        for change in reversed(self.changes):
            if change.name == name:
                return change.value
        return None

    def note(self, topic: str, severity: str, text: str) -> None:
        self.findings.append(Finding(topic, severity, text))

    def withhold(self, name: str, reason: str) -> None:
        """Leave name unset: no later default sets it (a site profile's null value), and a note says why.
        A value of the user's stays, with a warning: the site's sources say not to set it."""
        self.withheld[name] = reason
        if name in self.env:
            self.note("unset", "warning", f"{name}={self.env[name]} is set, but {reason}: unset it")
        else:
            self.note("unset", "info", f"{name} left unset (the library's own default): {reason}")

    def default(self, name: str, value: str, reason: str, origin: str = FABRIC_DEFAULT) -> bool:
        """Set name unless the user (or an earlier, more specific rule) already did, or a site left it unset."""
        if name in self.withheld:
            return False
        if name in self.env:
            if self.env[name] != value:
                self.note("kept", "info", f"kept your {name}={self.env[name]} (default would be {value}: {reason})")
            return False
        if self.planned(name) is not None:
            return False
        self.changes.append(EnvChange(name, value, reason, origin))
        return True

    def force(self, name: str, value: str, reason: str) -> None:
        """Set name even if the environment has it (an explicit command-line choice)."""
        self.changes = [c for c in self.changes if c.name != name]
        self.changes.append(EnvChange(name, value, reason, FABRIC_DEFAULT))


# NCCL's socket transport: "For generic 100G networks, this value can be manually set to 4. However, the
# product of NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD cannot exceed 64" (NCCL's environment
# variables page, NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD:
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-nthreads).
SOCKET_NTHREADS = 4
MAX_SOCKETS = 64
SOCKET_SOURCE = ("NCCL env docs (NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD: 4 each on generic 100G networks, "
                 "their product at most 64), as EPFL RCP's RunAI multi-node guide sets them")


def pod_socket_tuning(builder: EnvBuilder, request: FabricRequest, why: str) -> None:
    """NCCL's socket threads, and one socket per GPU of the pod, as RCP's guide sets them: in a pod whose
    scheduler counts its GPUs (the grant's pod_count: RunAI's RUNAI_NUM_OF_GPUS)."""
    for name in request.gpu_grant.pod_count:
        gpus = request.env.get(name, "")
        if gpus.isdigit() and int(gpus) > 0:
            builder.default("NCCL_SOCKET_NTHREADS", str(SOCKET_NTHREADS), f"{SOCKET_SOURCE}: {why}")
            builder.default("NCCL_NSOCKS_PERTHREAD", str(min(int(gpus), MAX_SOCKETS // SOCKET_NTHREADS)),
                            f"{SOCKET_SOURCE}: one socket per GPU (${name}), {why}")
            return
