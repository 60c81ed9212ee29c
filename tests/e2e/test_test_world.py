"""The test world itself: pip in the test base reads this machine's pip configuration and every
file it names, and a failure to build the world stops the e2e run in one line."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import conftest
import e2e_image as image
import pip_setup
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def base() -> image.BaseRecipe:
    reason = image.missing_tools()
    if reason:
        pytest.skip(f"the test base: {reason}")
    try:
        return image.ensure_base()
    except image.ImageError as error:
        conftest.setup_failed(conftest.SetupError(f"the test base: {error}"))


def _in_base(tree: Path, argv: list[str], binds: list[str] = ()) -> subprocess.CompletedProcess:
    """argv in the base's tree as its build runs pip there: none of this machine's PIP_* variables."""
    return subprocess.run(["ch-run", "--unset-env=PIP_*", *binds, str(tree), "--", *argv], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "USER": os.environ.get("USER") or "root"})


def test_pip_in_the_test_base_reads_this_machines_configuration_and_every_file_it_names(base, tmp_path):
    tree = image.charliecloud_copy(tmp_path / "base", image.stored_path(base.tag).name)

    listed = _in_base(tree, ["python3", "-m", "pip", "config", "list"])

    assert listed.returncode == 0, listed.stderr
    inside, here = pip_setup.parse_config_list(listed.stdout), pip_setup.parse_config_list(
        pip_setup.read_config_list())
    # Every setting this machine's pip has, the base's has, with the same value (a list as lines).
    for section, options in here.items():
        for name, value in options.items():
            if name not in pip_setup.DROPPED_OPTIONS:
                assert inside.get(section, {}).get(name, "").split() == value.split(), (section, name, listed.stdout)
    for path, digest in base.pip.files:
        assert hashlib.sha256((tree / path.lstrip("/")).read_bytes()).hexdigest() == digest, path


def test_pip_in_the_test_base_honours_a_constraints_file_under_etc_that_the_configuration_names(base, tmp_path):
    """The cap this machine's pip has is a constraints file under /etc/xdg/pip; pip in the base
    must apply such a file, not only find it."""
    # Not under /tmp, which ch-run binds from this machine (ch-run(1), --private-tmp).
    host = Path(tempfile.mkdtemp(prefix="ddp-e2e-pip-probe-", dir="/var/tmp"))
    try:
        probe = host / "etc" / "xdg" / "pip" / "constraints.txt"
        probe.parent.mkdir(parents=True)
        probe.write_text("numpy<1\n")
        tree = image.charliecloud_copy(tmp_path / "base", image.stored_path(base.tag).name)
        binds = pip_setup.stage(pip_setup.resolve({"global": {"constraint": str(probe)}}), tree)
    finally:
        shutil.rmtree(host)  # what the base sees is its own copy

    # numpy is installed in the base (2.x): the constraint rules it out, offline.
    refused = _in_base(tree, ["python3", "-m", "pip", "install", "--dry-run", "--no-index", "numpy"], binds)

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "The user requested (constraint) numpy<1" in refused.stdout


def test_a_step_of_the_test_world_that_fails_stops_the_e2e_run_in_one_line_naming_it_and_its_log(tmp_path):
    """debootstrap of the cluster's root from a mirror that refuses connections: the e2e run
    (here one test file, in a cluster of its own) ends at once with one line, no traceback."""
    # Not this run's temporary root, nor its xdist worker number (which would offset the names given here).
    env = {name: value for name, value in os.environ.items()
           if name != "PYTEST_DEBUG_TEMPROOT" and not name.startswith("PYTEST_XDIST")}
    # The inner run's setup note is its own: make test prints the outer run's note as this run's failure.
    note = tmp_path / "setup-note"
    env.update({"DDP_E2E_DEBIAN_MIRROR": "http://127.0.0.1:9/debian", "DDP_E2E_ROOT_CACHE": str(tmp_path / "root"),
                "DDP_E2E_IMAGE_CACHE": str(tmp_path / "images"), "DDP_E2E_STATE": str(tmp_path / "state"),
                "DDP_E2E_PREFIX": "ddpe2efail", "DDP_E2E_SUBNET": "10.79.0", conftest.SETUP_NOTE_VAR: str(note)})

    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/e2e/test_cluster.py"],
                          cwd=conftest.REPO, env=env, capture_output=True, text=True, timeout=300)

    output = done.stdout + done.stderr
    assert done.returncode == conftest.SETUP_FAILED, output
    lines = [line for line in output.splitlines() if "e2e setup failed" in line]
    assert len(lines) == 1, output
    log = tmp_path / "root" / "debootstrap.log"
    assert re.search(r"e2e setup failed: the cluster's root: debootstrap of the cluster's root \(Debian sid\): "
                     r"exit 1: E: .*127\.0\.0\.1:9.* \(log: " + re.escape(str(log)) + r"\)", lines[0]), lines[0]
    assert log.is_file()
    [noted] = note.read_text().splitlines()  # what make test names at its end
    assert noted.startswith("e2e setup failed: the cluster's root: debootstrap") and noted in lines[0], noted
    assert "Traceback" not in output
    assert "ERROR at setup" not in output and "passed" not in output
