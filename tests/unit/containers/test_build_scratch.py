"""`make build-*` keeps Apptainer's cache and build sandbox off $HOME and /tmp, names where they
go, and stops in one line when that filesystem is too small.

The rule: Apptainer caches layers in $HOME/.apptainer/cache and builds in /tmp unless
APPTAINER_CACHEDIR / APPTAINER_TMPDIR are set (https://apptainer.org/docs/user/latest/build_env.html,
"Cache Folders" and "Temporary Folders"); an NGC base is ~20 GB and users' home directories fill
up (apptainer/apptainer#546, a 56 GB ~/.apptainer). A fake `apptainer` records the environment
the real one would see.
"""

from __future__ import annotations

import subprocess

import pytest
from definitions_paths import REPO


def fake_apptainer(tmp_path):
    """Answers `--version` as Apptainer 1.4.5 does (the Makefile's version floor asks first);
    accepts only `build`, and writes the two variables it was given, one per line."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "apptainer.env"
    (fake / "apptainer").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "apptainer version 1.4.5"; exit 0; }\n'
        '[ "$1" = build ] || exit 64\n'
        f'printf "%s\\n" "${{APPTAINER_CACHEDIR-unset}}" "${{APPTAINER_TMPDIR-unset}}" > "{log}"\n')
    (fake / "apptainer").chmod(0o755)
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
