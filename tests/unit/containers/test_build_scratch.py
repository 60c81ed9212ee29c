"""`make build-*` keeps Apptainer's cache and build sandbox off $HOME and /tmp, names where they
go, and stops in one line when that filesystem is too small.

The rule: Apptainer caches layers in $HOME/.apptainer/cache and builds in /tmp unless
APPTAINER_CACHEDIR / APPTAINER_TMPDIR are set (https://apptainer.org/docs/user/latest/build_env.html,
"Cache Folders" and "Temporary Folders"); an NGC base is ~20 GB and users' home directories fill
up (apptainer/apptainer#546, a 56 GB ~/.apptainer). A fake `apptainer` records the environment
the real one would see.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest
from definitions_paths import REPO


# `apptainer sif list` of an arm64 SIF as Apptainer 1.4 prints it: the squashfs partition's
# start-end in the fourth column (what build-olivia reads to unsquash it in place).
SIF_LIST = """------------------------------------------------------------------------------
ID   |GROUP   |LINK    |SIF POSITION (start-end)  |TYPE
------------------------------------------------------------------------------
1    |1       |NONE    |32176-32208               |Def.FILE
2    |1       |NONE    |32208-33022               |JSON.Generic
3    |1       |NONE    |36864-28954624            |FS (Squashfs/*System/arm64)
"""


def fake_apptainer(tmp_path):
    """Answers `--version` as Apptainer 1.4.5 does (the Makefile's version floor asks first) and
    `sif list` with SIF_LIST; accepts `build` otherwise, and writes the two variables it was
    given, one per line. A fake `unsquashfs` records where it was asked to unpack (-d DIR)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "apptainer.env"
    (fake / "apptainer").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "apptainer version 1.4.5"; exit 0; }\n'
        f'[ "$1 $2" = "sif list" ] && {{ cat <<"EOF"\n{SIF_LIST}EOF\nexit 0; }}\n'
        '[ "$1" = build ] || exit 64\n'
        f'printf "%s\\n" "${{APPTAINER_CACHEDIR-unset}}" "${{APPTAINER_TMPDIR-unset}}" > "{log}"\n')
    (fake / "unsquashfs").write_text(
        '#!/bin/sh\n[ "$1 $2 $3 $4" = "-no-xattrs -o 36864 -d" ] || exit 64\n'
        f'mkdir -p "$5" && printf "%s\\n" "$5" > "{tmp_path}/unsquashfs.dir"\n')
    for tool in ("apptainer", "unsquashfs"):
        (fake / tool).chmod(0o755)
    return fake, log


def make(target: str, tmp_path, env: dict, *variables: str) -> subprocess.CompletedProcess:
    fake, _ = fake_apptainer(tmp_path)
    home = tmp_path / "home"
    return subprocess.run(
        # No free-space floor unless a test sets one: what this machine has free is not under test.
        ["make", "--no-print-directory", "-C", str(REPO), target, f"SIF_DIR={tmp_path}/sif", "BUILD_MIN_FREE_GB=0",
         *variables],
        env={"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(home), **env},
        capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("target", ["build-olivia", "build-lumi", "build-x86", "build-cpu"])
def test_unset_cache_and_tmp_go_to_scratch_and_are_named(target, tmp_path):
    scratch = tmp_path / "scratch"
    result = make(target, tmp_path, {"SCRATCH": str(scratch)}, f"OLIVIA_BASE_SIF={tmp_path}/absent.sif",
                  f"LUMI_BASE_SIF={tmp_path}/absent.sif")
    assert result.returncode == 0, result.stderr
    cache, tmp = f"{scratch}/.apptainer-build/cache", f"{scratch}/.apptainer-build/tmp"
    assert (tmp_path / "apptainer.env").read_text().splitlines() == [cache, tmp]
    assert f"APPTAINER_CACHEDIR={cache} (" in result.stdout and f"APPTAINER_TMPDIR={tmp} (" in result.stdout


def test_sigma2_userwork_is_preferred_over_scratch(tmp_path):
    # Sigma2's clusters give each user $USERWORK (/cluster/work/users/$USER) for large files.
    result = make("build-x86", tmp_path, {"USERWORK": str(tmp_path / "work"), "SCRATCH": str(tmp_path / "s")})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apptainer.env").read_text().splitlines()[0] == f"{tmp_path}/work/.apptainer-build/cache"


def test_without_any_scratch_the_build_stays_beside_the_sif(tmp_path):
    result = make("build-cpu", tmp_path, {})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apptainer.env").read_text().splitlines()[1] == f"{tmp_path}/sif/.apptainer-build/tmp"


def test_the_users_own_settings_are_kept(tmp_path):
    mine = {"APPTAINER_CACHEDIR": str(tmp_path / "c"), "APPTAINER_TMPDIR": str(tmp_path / "t"),
            "SCRATCH": str(tmp_path / "scratch")}
    result = make("build-x86", tmp_path, mine)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apptainer.env").read_text().splitlines() == [mine["APPTAINER_CACHEDIR"], mine["APPTAINER_TMPDIR"]]


def test_too_little_space_stops_before_apptainer_in_one_line(tmp_path):
    result = make("build-x86", tmp_path, {"SCRATCH": str(tmp_path / "scratch")}, "BUILD_MIN_FREE_GB=1000000")
    assert result.returncode != 0
    assert not (tmp_path / "apptainer.env").exists()  # apptainer never ran
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: APPTAINER_CACHEDIR={tmp_path}/scratch/.apptainer-build/cache has ")
    assert first.endswith("GB free, an image build needs about 1000000 GB: set BUILD_SCRATCH=DIR "
                          "(or APPTAINER_CACHEDIR) to a larger filesystem, e.g. your scratch or project work area")


def test_an_unwritable_scratch_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = make("build-cpu", tmp_path, {}, f"BUILD_SCRATCH={blocker}/sub")
    assert result.returncode != 0 and not (tmp_path / "apptainer.env").exists()
    assert result.stderr.splitlines()[0] == (f"error: APPTAINER_CACHEDIR={blocker}/sub/cache cannot be created: "
                                             f"set APPTAINER_CACHEDIR (or BUILD_SCRATCH=DIR) to a directory you can write")


def test_the_arm64_base_is_unpacked_in_the_checked_scratch_not_in_tmpdir(tmp_path):
    # On an x86_64 host build-olivia unpacks the pre-pulled arm64 SIF (~20 GB for the NGC base)
    # before building on it: into APPTAINER_TMPDIR, whose free space build-space.sh checks, never
    # into $TMPDIR (a login node's /tmp is small and shared). This test runs on x86_64 hosts.
    if platform.machine() == "aarch64":
        pytest.skip("on aarch64 build-olivia builds on the SIF itself and unpacks nothing")
    base = tmp_path / "pytorch_25.06-py3.sif"
    base.write_text("an arm64 SIF")
    small_tmp = tmp_path / "login-tmp"
    small_tmp.mkdir()
    scratch = tmp_path / "scratch"

    result = make("build-olivia", tmp_path, {"SCRATCH": str(scratch), "TMPDIR": str(small_tmp)},
                  f"OLIVIA_BASE_SIF={base}")

    assert result.returncode == 0, result.stderr
    unpacked = Path((tmp_path / "unsquashfs.dir").read_text().strip())
    assert unpacked.parent.parent == scratch / ".apptainer-build" / "tmp", unpacked
    assert unpacked.parent.name.startswith("olivia-base.") and unpacked.name == "pytorch_25.06-py3"
    assert list(small_tmp.iterdir()) == []
    assert not unpacked.parent.exists()  # removed once the build is done
