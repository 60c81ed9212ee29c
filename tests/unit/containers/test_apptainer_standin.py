"""The e2e `apptainer` stand-in's rules, each as the Apptainer user guide documents it.

Environment: https://apptainer.org/docs/user/main/environment_and_metadata.html
Binds: https://apptainer.org/docs/user/main/bind_paths_and_mounts.html
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys

import pytest
from definitions_paths import REPO

STANDIN = REPO / "tests" / "e2e" / "bin" / "apptainer"
E2E = REPO / "tests" / "e2e"


def _load():
    loader = importlib.machinery.SourceFileLoader("apptainer_standin", str(STANDIN))
    spec = importlib.util.spec_from_loader("apptainer_standin", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


standin = _load()


def env_for(host, image_env=None, overrides=None):
    return standin.container_environment(host, image_env or {}, overrides or {}, "/x/train.sif", "run")


def test_host_path_and_library_path_never_pass_in():
    env = env_for({"PATH": "/host/bin", "LD_LIBRARY_PATH": "/host/lib", "FOO": "1"})
    assert env["PATH"] == standin.DEFAULT_PATH
    assert env["LD_LIBRARY_PATH"] == "/.singularity.d/libs"
    assert env["FOO"] == "1"


def test_the_images_own_variable_wins_over_the_hosts():
    env = env_for({"PYTHONPATH": "/host/site-packages"}, {"PYTHONPATH": "/opt/ddp/python"})
    assert env["PYTHONPATH"] == "/opt/ddp/python"


def test_image_path_keeps_its_order_and_gains_the_missing_default_parts():
    env = env_for({}, {"PATH": "/opt/ddp/bin:/usr/bin"})
    parts = env["PATH"].split(":")
    assert parts[:2] == ["/opt/ddp/bin", "/usr/bin"] and set(standin.DEFAULT_PATH.split(":")) <= set(parts)


def test_apptainerenv_and_env_option_set_variables_last_and_edit_path():
    env = env_for({"APPTAINERENV_FOO": "from-prefix", "APPTAINERENV_PREPEND_PATH": "/first"},
                  {"FOO": "image"}, {"BAR": "option", "APPEND_PATH": "/last"})
    assert env["FOO"] == "from-prefix" and env["BAR"] == "option"
    assert env["PATH"].startswith("/first:") and env["PATH"].endswith(":/last")
    assert "APPTAINERENV_FOO" not in env


def test_bind_destination_defaults_to_the_source(tmp_path):
    assert standin.bind_pairs([str(tmp_path)]) == [(str(tmp_path), str(tmp_path))]
    assert standin.bind_pairs([f"{tmp_path}:/data:rw"]) == [(str(tmp_path), "/data")]


@pytest.mark.parametrize("spec", ["{d}:/data:ro", "relative:/data", "{d}/absent:/data", "{d}:/a:rw:x"])
def test_binds_the_stand_in_cannot_honour_fail_loudly(spec, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        standin.bind_pairs([spec.format(d=tmp_path)])
    assert stopped.value.code == 255


def test_pwd_is_bound_unless_another_bind_covers_it():
    assert ("/work/x", "/work/x") in standin.default_binds("/root", "/work/x", [])
    assert not any(t == "/work/x" for _, t in standin.default_binds("/root", "/work/x", ["/work"]))
    assert not any(t == "/tmp/a" for _, t in standin.default_binds("/root", "/tmp/a", []))


def test_a_file_bind_point_is_an_empty_file_and_links_are_not_followed(tmp_path):
    root = tmp_path / "image"
    (root / "opt").mkdir(parents=True)
    (root / "lib").symlink_to(tmp_path / "outside")
    library = tmp_path / "libx.so.1"
    library.write_bytes(b"\x7fELF")

    standin.make_bind_point(root, str(library), "/opt/host-libs/libx.so.1")
    standin.make_bind_point(root, str(tmp_path), "/lib/private")

    assert (root / "opt/host-libs/libx.so.1").is_file() and (root / "opt/host-libs").is_dir()
    assert not (tmp_path / "outside").exists()


def test_bind_points_another_node_makes_at_the_same_moment_are_no_error(tmp_path, monkeypatch):
    # Every node's srun task starts the stand-in at once on one shared image tree: a
    # directory or file can appear between our look and our mkdir.
    root = tmp_path / "image"
    (root / "data" / "run").mkdir(parents=True)
    (root / "data" / "lib.so").touch()
    monkeypatch.setattr(standin.Path, "exists", lambda self: False)  # looked just before the other did

    standin.make_bind_point(root, str(tmp_path), "/data/run")
    standin.make_bind_point(root, str(tmp_path / "nothing.so"), "/data/lib.so")

    assert (root / "data" / "run").is_dir() and (root / "data" / "lib.so").is_file()


@pytest.mark.parametrize("argv", [["shell", "x.sif"], ["run", "--cleanenv", "x.sif"], ["run", "--writable", "x.sif"]])
def test_what_it_does_not_support_fails_with_one_line(argv):
    done = subprocess.run([sys.executable, str(STANDIN), *argv], capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert len(done.stderr.strip().splitlines()) == 1 and "not supported" in done.stderr


def test_a_missing_image_file_is_reported_as_apptainer_does(tmp_path):
    done = subprocess.run([sys.executable, str(STANDIN), "run", "--nv", str(tmp_path / "none.sif")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 255 and "could not open image" in done.stderr


def test_the_debian_mirror_is_read_from_deb822_or_one_line_sources(tmp_path):
    sys.path.insert(0, str(E2E))
    import e2e_image

    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert e2e_image.debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert e2e_image.debian_mirror(tmp_path) == "http://other.example/debian"


def test_empty_argument_defaults_are_passed_to_ch_image_as_empty_values():
    sys.path.insert(0, str(E2E))
    import e2e_image

    dockerfile = 'ARG BASE_IMAGE=x\nFROM $BASE_IMAGE\nARG SITE=""\nARG VERSION=0.1.0\nARG NOTE=""\n'
    assert e2e_image.empty_default_arguments(dockerfile) == ["--build-arg", "SITE=", "--build-arg", "NOTE="]
