"""The e2e image builder's pure parts (tests/e2e/e2e_image.py): what it reads from this machine."""
from __future__ import annotations

import sys

import pytest

import e2e_image
from definitions_paths import REPO


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


def test_a_failed_step_is_one_line_naming_it_its_first_error_line_and_its_log(tmp_path):
    """pip's log of the failure this machine's constraint caused: the line to show is pip's
    ERROR, not the last line (pip's notice about a new version, say)."""
    log = tmp_path / "pip.log"
    with pytest.raises(e2e_image.ImageError) as raised:
        e2e_image.run_step([sys.executable, "-c", "import sys\n"
                            "print('Looking in links: /opt/wheels')\n"
                            "print('ERROR: Could not open requirements file: [Errno 2] No such file or directory: "
                            "\\'/etc/xdg/pip/constraints.txt\\'', file=sys.stderr)\n"
                            "print('[notice] A new release of pip is available', file=sys.stderr)\n"
                            "sys.exit(1)"], "pip in the test base", log)
    message = str(raised.value)
    assert "\n" not in message
    assert message == ("pip in the test base: exit 1: ERROR: Could not open requirements file: [Errno 2] No such "
                       f"file or directory: '/etc/xdg/pip/constraints.txt' (log: {log})")
    assert "[notice]" in log.read_text()  # the whole output is in the log


def test_first_error_lines_of_the_tools_that_build_the_test_world():
    assert e2e_image.first_error_line("I: Retrieving Release\nE: Failed getting release file http://x/Release\n") \
        == "E: Failed getting release file http://x/Release"
    assert e2e_image.first_error_line("INFO:    Starting build...\nFATAL:   While performing build: conveyor failed\n"
                                      "make: *** [Makefile:9: build-cpu] Error 255\n") \
        == "FATAL:   While performing build: conveyor failed"
    assert e2e_image.first_error_line("one\nlast words\n\n") == "last words"
    assert e2e_image.first_error_line("") == "no output"


def test_a_step_whose_program_is_missing_is_one_line_too(tmp_path):
    with pytest.raises(e2e_image.ImageError, match=r"^debootstrap of the test base: cannot run /nonexistent/debootstrap: "
                       r"No such file or directory \(log: "):
        e2e_image.run_step(["/nonexistent/debootstrap"], "debootstrap of the test base", tmp_path / "d.log")
