"""tests/e2e/world.py: the e2e world (the cluster's root, the test base) built ahead of the e2e session,
beside the unit suite; both at once, each named with its time, a failure named and left to the session."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import apptainer_root
import e2e_image
import pytest
import world


@pytest.fixture
def tools_here(monkeypatch):
    monkeypatch.setattr(apptainer_root, "missing_tools", lambda: None)
    monkeypatch.setattr(e2e_image, "missing_tools", lambda: None)


def test_the_root_and_the_base_are_built_side_by_side_each_named_with_its_time(monkeypatch, capsys, tools_here):
    together = threading.Barrier(2, timeout=10)  # each build waits for the other to start: side by side

    def root():
        together.wait()
        return "/var/tmp/ddp-e2e-apptainer/root-1"

    def base():
        together.wait()
        return SimpleNamespace(tag="ddp-e2e-base:2")

    monkeypatch.setattr(apptainer_root, "build", root)
    monkeypatch.setattr(e2e_image, "ensure_base", base)
    assert world.main() == 0
    assert [line.rsplit(" (", 1)[0] for line in capsys.readouterr().out.splitlines()] == [
        "e2e world: cluster root: /var/tmp/ddp-e2e-apptainer/root-1", "e2e world: test base: ddp-e2e-base:2"]


def test_a_part_that_fails_is_named_the_other_is_still_built_and_the_exit_is_1(monkeypatch, capsys, tools_here):
    def base():
        raise e2e_image.ImageError("debootstrap of the test base", "E: Couldn't download packages")

    monkeypatch.setattr(apptainer_root, "build", lambda: "/var/tmp/ddp-e2e-apptainer/root-1")
    monkeypatch.setattr(e2e_image, "ensure_base", base)
    assert world.main() == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("e2e world: cluster root: /var/tmp/ddp-e2e-apptainer/root-1 (")
    assert out[1].startswith("e2e world: test base: not built (debootstrap of the test base")
    assert out[1].endswith("; the e2e session tries again")


def test_where_a_tool_is_missing_nothing_is_built_and_the_session_is_left_to_say_so(monkeypatch, capsys):
    monkeypatch.setattr(apptainer_root, "missing_tools", lambda: "debootstrap not installed")
    monkeypatch.setattr(apptainer_root, "build", lambda: pytest.fail("built without its tools"))
    assert world.main() == 0
    assert capsys.readouterr().out == "e2e world: not built ahead: debootstrap not installed\n"
