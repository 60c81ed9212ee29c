"""A root of its own for the real Apptainer and the test cluster's SLURM (Debian sid).

Debian ships Apptainer (1.4) only in sid, built against a newer C library than this
machine's Debian 12 has, so it cannot be installed here; debootstrap puts it, SLURM,
munge and squashfuse into a root under /var/tmp, built once per recipe hash.
tests/e2e/cluster/cluster.sh runs the whole cluster in that root (pivot_root in a private
mount namespace), and the jobs run as TEST_USER: Apptainer refuses root here, where
root lacks CAP_SYS_RESOURCE ("Requesting capability set ... while permitted capability
set is ..."), and cluster users are not root. TEST_USER has /etc/subuid and /etc/subgid
ranges, so `apptainer build --fakeroot` runs %post (Apptainer admin guide, "User
Namespaces & Fakeroot": https://apptainer.org/docs/admin/main/user_namespace.html).
Usage: python tests/e2e/apptainer_root.py build   (prints the root's path)
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import e2e_image

CACHE = Path(os.environ.get("DDP_E2E_ROOT_CACHE", "/var/tmp/ddp-e2e-apptainer"))
TEST_USER = "ddp-e2e"
TEST_UID = 47000
SUBID_RANGE = "200000:65536"
# apptainer + squashfuse/fuse3: the SIF mounted by squashfuse_ll, as unprivileged
# Apptainer does on clusters; uidmap: newuidmap for --fakeroot; charliecloud-runtime:
# ch-run for the RunAI pod test (the Dockerfile path), which runs in the nodes too.
PACKAGES = ("apptainer", "ca-certificates", "squashfuse", "fuse3", "uidmap", "slurmctld", "slurmd",
            "slurm-client", "munge", "iproute2", "python3", "procps", "hostname", "make",
            "charliecloud-runtime")
RECIPE_VERSION = 1  # bump when the steps below change


@dataclass(frozen=True)
class RootRecipe:
    suite: str
    mirror: str
    packages: tuple
    user: str
    uid: int
    version: int = RECIPE_VERSION

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def recipe() -> RootRecipe:
    return RootRecipe(suite="sid", mirror=e2e_image.debian_mirror(), packages=PACKAGES, user=TEST_USER,
                      uid=TEST_UID)


def root_path(wanted: RootRecipe | None = None) -> Path:
    return CACHE / f"root-{(wanted or recipe()).key()}"


def _log(message: str) -> None:
    print(f"apptainer-root: {message}", file=sys.stderr, flush=True)


def _run(argv: list, step: str, log: Path) -> str:
    return e2e_image.run_step(argv, step, log, tag="apptainer-root")


def missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "needs root (debootstrap, mount namespaces)"
    for tool in ("debootstrap", "unshare", "nsenter", "pivot_root"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (make sysdeps installs debootstrap and util-linux)"
    return None


def _add_user(tree: Path, wanted: RootRecipe) -> None:
    _run(["chroot", str(tree), "useradd", "--create-home", "--uid", str(wanted.uid), "--user-group",
          "--shell", "/bin/bash", wanted.user], f"useradd {wanted.user} in the cluster's root", CACHE / "useradd.log")
    for name in ("subuid", "subgid"):
        (tree / "etc" / name).write_text(f"{wanted.user}:{SUBID_RANGE}\n")


def build() -> Path:
    """The root for the current recipe, built when missing; one build at a time."""
    reason = missing_tools()
    if reason:
        raise e2e_image.ImageError("tools for the cluster's root", reason)
    wanted = recipe()
    path = root_path(wanted)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / ".complete").exists():
            return path
        _log(f"building {path} (once per recipe: debootstrap {wanted.suite} with {', '.join(wanted.packages)})")
        tree = CACHE / f"building-{wanted.key()}"
        shutil.rmtree(tree, ignore_errors=True)
        _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(wanted.packages), wanted.suite,
              str(tree), wanted.mirror], f"debootstrap of the cluster's root (Debian {wanted.suite})",
             CACHE / "debootstrap.log")
        _add_user(tree, wanted)
        # The Apptainer version this root runs, for `make test`'s summary.
        version = _run(["chroot", str(tree), "apptainer", "--version"], "apptainer --version in the cluster's root",
                       CACHE / "version.log").strip()
        (tree / ".complete").write_text(version + "\n")
        shutil.rmtree(path, ignore_errors=True)
        tree.rename(path)
    return path


def apptainer_version(path: Path | None = None) -> str:
    return ((path or root_path()) / ".complete").read_text().strip()


def main(argv: list[str]) -> int:
    if argv[:1] != ["build"]:
        print("usage: apptainer_root.py build", file=sys.stderr)
        return 2
    try:
        path = build()
    except e2e_image.ImageError as error:
        print(f"apptainer-root: error: {error}", file=sys.stderr)
        return 1
    _log(apptainer_version(path))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
