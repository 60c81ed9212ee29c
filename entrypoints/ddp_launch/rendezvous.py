"""Where the workers meet: the head's address, a per-job port, a bounded DNS wait.

The only network I/O of the launcher is the one getaddrinfo lookup done here.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ddp_launch.errors import LaunchError

# Ports 20000-29999: unprivileged, below Linux's ephemeral range (32768-60999)
# so an outgoing connection cannot already hold it, and above common services.
PORT_BASE = 20000
PORT_JOB_SLOTS = 1000
PORT_STEP_SLOTS = 10

Resolver = Callable[[str], str | None]


def rendezvous_port(job_id: int, step_id: int) -> int:
    """20000 + (job_id mod 1000) * 10 + (step_id mod 10).

    Every node of a step computes the same value with no communication; jobs
    whose ids differ by less than 1000 (all jobs started near each other, so the
    ones that can share a node) never collide, and steps 0-9 of one job do not
    either. A fixed 29500 collides as soon as two jobs share a node
    (pytorch#116974: a 10-minute join timeout).
    """
    return PORT_BASE + (job_id % PORT_JOB_SLOTS) * PORT_STEP_SLOTS + step_id % PORT_STEP_SLOTS


def ipv4_literal(host: str) -> str | None:
    """host when it is written as an IPv4 address (its own answer, no lookup), else None."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# RFC 1035 section 2.3.4: a label is at most 63 octets, a name at most 255
# octets on the wire, which leaves 253 characters in the dotted text form.
MAX_LABEL = 63
MAX_NAME = 253


def dns_name(host: str) -> bytes:
    """host as DNS carries it: ASCII as it is, anything else IDNA-encoded (UnicodeError if it cannot be).

    The resolver is given these bytes too. A str would make socket load the idna codec
    for every name, ASCII or not: 2.7 ms of every launch (benchmarks/launch_overhead.py,
    80 interleaved runs, 2-core VM).
    """
    return host.encode("ascii") if host.isascii() else host.encode("idna")


def host_name_problem(host: str) -> str | None:
    """Why host cannot be looked up as a name or address, or None when it can.

    The resolver would fail on these, some of them with a UnicodeError traceback
    from the IDNA codec (a label over 63 characters, bytes of the environment
    that are not UTF-8, which Python keeps as surrogates).
    """
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if not host:
        return "it is empty"
    if any(0xDC80 <= ord(char) <= 0xDCFF for char in host):
        return "it holds bytes that are not UTF-8"
    if any(char.isspace() or not char.isprintable() for char in host):
        return "it holds spaces or control characters"
    try:
        wire = dns_name(host)
    except UnicodeError:
        return "it cannot be encoded for DNS (IDNA)"
    labels = wire.rstrip(b".").split(b".")
    if len(wire.rstrip(b".")) > MAX_NAME:
        return f"over {MAX_NAME} characters"
    if any(not label for label in labels):
        return "it has an empty label ('..')"
    longest = max(labels, key=len)
    if len(longest) > MAX_LABEL:
        return f"its label {longest[:20].decode()}... has {len(longest)} characters, over DNS's {MAX_LABEL}"
    return None


@dataclass(frozen=True)
class Head:
    """The rendezvous host as a scheduler names it and where the name came from, checked once:
    problem says why no resolver can take it (None: one can). The probe looks up only a name
    without a problem; the plan refuses one with, in its turn after the scheduler's other checks."""

    name: str
    source: str
    problem: str | None = None

    @classmethod
    def named(cls, name: str, source: str) -> Head:
        return cls(name, source, host_name_problem(name))

    def checked(self) -> str:
        """The name, or a LaunchError naming where it came from when no resolver can take it."""
        if self.problem is not None:
            raise LaunchError(f"{self.source}={self.name!r} is not a valid host name ({self.problem}): give the "
                              f"head node's name or IPv4 address")
        return self.name


def lookup_ipv4(host: str) -> str | None:
    """host's first IPv4 address that is not loopback (else its first), or None when it does not resolve.

    Debian and Ubuntu map a host's own name to 127.0.1.1 in /etc/hosts (Debian Reference,
    "The hostname resolution"), so on the head node itself getaddrinfo can answer
    ['127.0.1.1', '192.168.20.15']: the other nodes can reach only the second.
    host was checked when it was named (Head.named); a name no resolver takes answers None.
    """
    if ipv4_literal(host) is not None:
        return host
    try:
        infos = socket.getaddrinfo(dns_name(host), None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return first_routable([info[4][0] for info in infos])


def first_routable(addresses: list[str]) -> str | None:
    """The first address that is not loopback, else the first one, else None."""
    return next((a for a in addresses if not ipaddress.ip_address(a).is_loopback), addresses[0] if addresses else None)


def waiting_resolver(
    timeout_s: float,
    report: Callable[[str], None],
    lookup: Resolver = lookup_ipv4,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    interval_s: float = 2.0,
) -> Resolver:
    """A resolver that retries for up to timeout_s, reporting progress.

    Kubernetes creates a pod's DNS record after the pod starts, sometimes tens
    of seconds later (pytorch#73682, kubeflow/pytorch-operator#125), so the
    first lookups of the master's service name may fail on a healthy job.
    """

    def resolve(host: str) -> str | None:
        start = clock()
        next_report = start
        while True:
            address = lookup(host)
            if address is not None:
                return address
            waited = clock() - start
            if waited >= timeout_s:
                raise LaunchError(
                    f"rendezvous host {host!r} did not resolve within {timeout_s:g} s: check that the "
                    f"master pod and its service exist, or raise DDP_LAUNCH_DNS_TIMEOUT"
                )
            if clock() >= next_report:
                report(f"ddp-launch: waiting for {host!r} to resolve ({waited:.0f} s of {timeout_s:g} s)")
                next_report = clock() + 10.0
            sleep(interval_s)

    return resolve
