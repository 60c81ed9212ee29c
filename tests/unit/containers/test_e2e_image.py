"""The e2e image builder's pure parts (tests/e2e/e2e_image.py): what it reads from this machine."""
from __future__ import annotations

import sys

from definitions_paths import REPO

sys.path.insert(0, str(REPO / "tests" / "e2e"))
import e2e_image  # noqa: E402


def test_the_debian_mirror_is_read_from_deb822_or_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert e2e_image.debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert e2e_image.debian_mirror(tmp_path) == "http://other.example/debian"


def test_empty_argument_defaults_are_passed_to_ch_image_as_empty_values():
    dockerfile = 'ARG BASE_IMAGE=x\nFROM $BASE_IMAGE\nARG SITE=""\nARG VERSION=0.1.0\nARG NOTE=""\n'
    assert e2e_image.empty_default_arguments(dockerfile) == ["--build-arg", "SITE=", "--build-arg", "NOTE="]
