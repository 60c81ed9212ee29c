"""The doctor's "image mount" check: how Apptainer mounted the SIF.

The process tree is shaped like the real Apptainer 1.4's (unprivileged, squashfuse):
`Apptainer runtime parent: IMAGE` starts `squashfuse_ll -f -o ...,offset=N /proc/self/fd/3
/var/lib/apptainer/mnt/session/rootfs` and, below it, the container's process. The e2e test
in tests/e2e/test_apptainer.py asks the real one.
"""
import os

from ddp_launch.doctor import image_mount
from ddp_launch.doctor.image_mount import ImageMountFacts
from ddp_launch.doctor.probes import read_image_mount

SIF = "/scratch/train.sif"


def _facts(**changes) -> ImageMountFacts:
    base = dict(image=SIF, image_is_dir=False, runtime_parent_seen=True, squashfuse_children=0,
                loop_backing_files=())
    return ImageMountFacts(**{**base, **changes})


def test_a_squashfuse_child_of_the_runtime_parent_warns_with_the_fix():
    kind = image_mount.classify(_facts(squashfuse_children=1))

    status, detail, fix = image_mount.describe(kind, SIF)
    assert kind == image_mount.SQUASHFUSE
    assert status == "WARN" and "squashfuse" in detail and SIF in detail
    assert "APPTAINER_UNSQUASH=1" in fix and "apptainer#665" in fix
    assert "SIGBUS" in detail


def test_a_loop_device_backed_by_the_sif_is_the_kernels_squashfs():
    kind = image_mount.classify(_facts(loop_backing_files=("/other.img", SIF)))

    assert kind == image_mount.KERNEL
    assert image_mount.describe(kind, SIF)[0] == "OK"


def test_neither_means_a_temporary_sandbox():
    kind = image_mount.classify(_facts())

    assert kind == image_mount.TEMPORARY_SANDBOX
    assert "temporary sandbox" in image_mount.describe(kind, SIF)[1]


def test_out_of_sight_of_the_runtime_parent_it_is_unknown_not_guessed():
    assert image_mount.classify(_facts(runtime_parent_seen=False)) == image_mount.UNKNOWN


def test_apptainer_unsquash_runs_a_temporary_sandbox_directory():
    facts = _facts(image="/tmp/rootfs-3162123955/root", image_is_dir=True)

    assert image_mount.classify(facts) == image_mount.TEMPORARY_SANDBOX


def test_a_sandbox_directory_is_reported_as_such():
    assert image_mount.classify(_facts(image="/scratch/train", image_is_dir=True)) == image_mount.SANDBOX


def test_outside_apptainer_the_check_is_skipped():
    kind = image_mount.classify(_facts(image=None))

    assert kind == image_mount.NOT_APPTAINER
    assert image_mount.describe(kind, None)[0] == "SKIP"


def _process(proc, pid, ppid, argv):
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "status").write_text(f"Name:\tx\nPPid:\t{ppid}\n")
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_the_probe_finds_the_squashfuse_child_of_an_ancestor(tmp_path):
    proc, me = tmp_path / "proc", os.getpid()
    proc.mkdir()
    _process(proc, me, 500, ["python3", "-m", "ddp_launch", "doctor"])
    _process(proc, 500, 1, [f"{image_mount.RUNTIME_PARENT}: train.sif"])
    _process(proc, 501, 500, ["/usr/bin/squashfuse_ll", "-f", "-o", "offset=36864", "/proc/self/fd/3",
                              "/var/lib/apptainer/mnt/session/rootfs"])
    _process(proc, 900, 1, ["/usr/bin/squashfuse_ll", "another container's"])
    loop = tmp_path / "block" / "loop0" / "loop"
    loop.mkdir(parents=True)
    (loop / "backing_file").write_text("/other.img\n")

    facts = read_image_mount({"APPTAINER_CONTAINER": SIF}, proc=str(proc), sys_block=str(tmp_path / "block"))

    assert facts == ImageMountFacts(SIF, False, True, 1, ("/other.img",))
