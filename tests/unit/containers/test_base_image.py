"""containers/base_image.py: the Makefile's base image per site, from containers/base-images.json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from base_image import IMAGES, base_image
from definitions_paths import CONTAINERS, REPO

DATA = json.loads((CONTAINERS / "base-images.json").read_text())


def test_the_newest_build_of_a_globbed_sif_is_the_base(tmp_path):
    # The LUMI AI Factory's build tags are timestamps (recipes/lumi-multitorch): the last in order is newest.
    for tag in ("20260415_130625", "20260902_101500", "20251201_090000"):
        (tmp_path / f"lumi-multitorch-torch-u24r70f21m50t210-{tag}.sif").write_bytes(b"")
    images = {"lumi": {"sif": f"{tmp_path}/lumi-multitorch-torch-u24r70f21m50t210-*.sif", "docker": "x"}}
    assert base_image(images, "lumi", "sif") == f"{tmp_path}/lumi-multitorch-torch-u24r70f21m50t210-20260902_101500.sif"


def test_a_sif_that_is_absent_is_printed_as_written_so_make_pulls_the_docker_image(tmp_path):
    images = {"lumi": {"sif": f"{tmp_path}/none-*.sif", "docker": "lumiaifactory/lumi-multitorch:torch"}}
    assert base_image(images, "lumi", "sif") == f"{tmp_path}/none-*.sif"
    assert base_image(images, "lumi", "docker") == "lumiaifactory/lumi-multitorch:torch"


@pytest.mark.parametrize("argv, message", [
    (["raven", "sif"], "error: no base image for site 'raven' in "),
    (["schema", "sif"], "error: no base image for site 'schema' in "),
    (["lumi", "arch"], "error: unknown field 'arch': one of sif, docker"),
])
def test_an_unknown_site_or_field_is_one_line_and_exit_2(argv, message):
    done = subprocess.run([sys.executable, str(CONTAINERS / "base_image.py"), *argv], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1
    if argv[0] == "raven":
        assert f"in {IMAGES} (known: lumi, olivia): add it there" in done.stderr


def test_every_site_says_where_its_base_comes_from():
    sites = {name: entry for name, entry in DATA.items() if name != "schema"}
    assert DATA["schema"] == 1 and {"olivia", "lumi"} <= set(sites)
    for name, entry in sites.items():
        assert set(entry) == {"sif", "docker", "source"}, name
        assert entry["sif"].startswith("/") and entry["sif"].endswith(".sif") and "https://" in entry["source"], name


def test_every_site_with_a_base_image_has_a_make_target():
    makefile = (REPO / "Makefile").read_text()
    for name in (name for name in DATA if name != "schema"):
        assert f"\nbuild-{name}:" in makefile and f"$(call base_image,{name},sif)" in makefile, name
