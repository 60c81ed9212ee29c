"""`make build-olivia` run for real on this x86_64 machine, with an offline arm64 base SIF.

Apptainer opens a SIF only when its architecture can run on the host (CompatibleWith in
its image code), so on an x86_64 login node the pre-pulled arm64 SIF cannot be a
`localimage` base as is; the Makefile unpacks it first. The result is read with the
commands that work across architectures: `apptainer sif header|list|dump`.
"""
import json
import re

import e2e_image as image
import pytest
from conftest import LONG, user_dir

pytestmark = pytest.mark.e2e


def _partitions(cluster, sif) -> list:
    listed = cluster.as_user(["apptainer", "sif", "list", sif])
    assert listed.returncode == 0, listed.stderr
    return re.findall(r"^(\d+)\s*\|[^|]*\|[^|]*\|[^|]*\|(.*)$", listed.stdout, re.M)


# Long on a cold cache: the arm64 base's debootstrap downloads for minutes with the CPU idle, which a worker
# started early spends beside the other workers' training rather than alone at the run's end.
@LONG
def test_make_build_olivia_on_x86_64_builds_an_arm64_sif_from_the_prepulled_one(cluster, tmp_path):
    base = image.arm64_base(lambda argv: cluster.run(argv, timeout=900))
    out = user_dir(tmp_path / "out")
    sif = out / "train-olivia-arm64.sif"
    # A $TMPDIR the user cannot write, as a full /tmp on a login node: the unpacked base (~20 GB
    # for the NGC one) belongs in the build scratch that build-space.sh checks, not there.
    login_tmp = user_dir(tmp_path / "login-tmp")
    login_tmp.chmod(0o555)
    scratch = out / ".apptainer-build"

    done = cluster.as_user(["make", "--no-print-directory", "build-olivia", f"OLIVIA_BASE_SIF={base}",
                            f"OLIVIA_SIF={sif}", f"BUILD_FLAGS={image.TEST_BUILD_FLAGS}",
                            *image.build_scratch(scratch)],
                           env={"TMPDIR": str(login_tmp)}, timeout=900)

    assert done.returncode == 0, done.stderr
    assert f"unpacking {base} (arm64) to {scratch}/tmp/olivia-base." in done.stdout
    assert "Architecture arm64 does not match build arch amd64" in done.stderr  # a warning only
    assert list((scratch / "tmp").glob("olivia-base.*")) == []  # the unpacked base is removed
    header = cluster.as_user(["apptainer", "sif", "header", sif])
    assert re.search(r"Primary Architecture:\s+arm64", header.stdout), header.stdout
    # The image's metadata: `{"data": {"attributes": {"labels": ...}}}` (what `inspect` reads).
    labels = {}
    for part, kind in _partitions(cluster, sif):
        if "JSON.Generic" in kind:
            dumped = cluster.as_user(["apptainer", "sif", "dump", part, sif])
            labels.update(json.loads(dumped.stdout)["data"]["attributes"].get("labels") or {})
    assert labels.get("org.ddp.architecture") == "arm64", labels
    assert labels.get("org.ddp.site") == "olivia"
    # What makes the unpacking necessary, as the real Apptainer says it.
    refused = cluster.as_user(["apptainer", "inspect", "--labels", sif])
    assert refused.returncode != 0
    assert "architecture (arm64) could not run on the host's (amd64)" in refused.stderr
