"""The e2e test base's pip configuration (tests/e2e/pip_setup.py): every file and local source
that this machine's pip configuration names reaches pip inside the base.

pip's rules encoded here are from its user guide: "Configuration" (files, PIP_CONFIG_FILE,
PIP_* variables; `pip config list`), "Requirements File Format" (-r/-c lines, relative to
the file) and "Constraints Files" (https://pip.pypa.io/en/stable/topics/configuration/,
https://pip.pypa.io/en/stable/reference/requirements-file-format/).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import e2e_image
import pip_setup
import pytest
from definitions_paths import REPO


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pip_env(conf: Path, **variables: str) -> dict:
    """An environment in which pip reads conf and the given PIP_* variables, and not this
    machine's files under /etc/xdg (XDG_CONFIG_DIRS moves pip's global files)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": str(conf), "XDG_CONFIG_DIRS": str(conf.parent / "no-xdg"), **variables}


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    """A machine's pip files laid out as this one's: a constraints file under etc/xdg/pip that
    refers to a second one beside it, a local index and a find-links directory."""
    etc = tmp_path / "etc" / "xdg" / "pip"
    etc.mkdir(parents=True)
    (etc / "constraints.txt").write_text("torch<=2.14.1\n-c more-constraints.txt\n")
    (etc / "more-constraints.txt").write_text("torchvision<=0.29.1\n")
    (tmp_path / "pypi" / "simple").mkdir(parents=True)
    (tmp_path / "wheels").mkdir()
    return tmp_path


def test_pip_config_list_is_read_with_its_quoting_and_env_variables_as_global():
    text = ("global.constraint='/etc/xdg/pip/constraints.txt'\n"
            ":env:.find-links='/opt/wheels'\n"
            "install.index-url=\"https://mirror.example/it's/simple\"\n"
            "not a setting line\n")
    assert pip_setup.parse_config_list(text) == {
        "global": {"constraint": "/etc/xdg/pip/constraints.txt", "find-links": "/opt/wheels"},
        "install": {"index-url": "https://mirror.example/it's/simple"},
    }


def test_a_constraints_file_named_by_a_config_file_is_copied_with_the_files_it_names(machine):
    conf = machine / "pip.conf"
    conf.write_text(f"[global]\nconstraint = {machine}/etc/xdg/pip/constraints.txt\n"
                    f"extra-index-url = file://{machine}/pypi/simple https://pypi.example/simple\n")
    # The real pip's `pip config list`, as `make venv` would read it.
    setup = pip_setup.machine_setup(_pip_env(conf, PIP_FIND_LINKS=str(machine / "wheels")))

    first, second = machine / "etc/xdg/pip/constraints.txt", machine / "etc/xdg/pip/more-constraints.txt"
    assert {str(first): _sha(first), str(second): _sha(second)}.items() <= dict(setup.files).items()
    # A file:// index binds its parent (its links may go up a level); a web index binds nothing.
    assert setup.directories[:2] == (str(machine / "pypi"), str(machine / "wheels"))
    assert f"constraint = {first}" in setup.conf
    assert "https://pypi.example/simple" in setup.conf


def test_a_file_under_the_machines_own_etc_is_copied_too():
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file():
        pytest.skip(f"{bundle} not on this machine (Debian's ca-certificates)")
    setup = pip_setup.resolve({"global": {"cert": str(bundle)}})
    assert setup.files == ((str(bundle), _sha(bundle)),)
    assert setup.directories == ()


def test_staging_copies_each_file_to_the_same_path_in_the_tree_and_binds_the_sources(machine, tmp_path):
    conf = machine / "pip.conf"
    conf.write_text(f"[global]\nconstraint = {machine}/etc/xdg/pip/constraints.txt\n"
                    f"find-links = {machine}/wheels\n")
    setup = pip_setup.machine_setup(_pip_env(conf))
    tree = tmp_path / "tree"

    binds = pip_setup.stage(setup, tree)

    for path, digest in setup.files:
        assert _sha(tree / path.lstrip("/")) == digest
    assert (tree / "etc/pip.conf").read_text() == setup.conf
    assert binds[:2] == ["-b", f"{machine}/wheels:{machine}/wheels"]
    assert (tree / str(machine / "wheels").lstrip("/")).is_dir()  # its mount point


def test_staging_never_writes_through_a_file_the_tree_shares_with_another(machine, tmp_path):
    """A hard-linked copy of an image shares its files' inodes: writing /etc/pip.conf in place
    would change the image it was copied from."""
    tree, original = tmp_path / "tree", tmp_path / "original-pip.conf"
    original.write_text("[global]\nindex-url = https://elsewhere.example/simple\n")
    (tree / "etc").mkdir(parents=True)
    os.link(original, tree / "etc/pip.conf")
    pip_setup.stage(pip_setup.PipSetup(conf="[global]\n"), tree)
    assert original.read_text().startswith("[global]\nindex-url")
    assert (tree / "etc/pip.conf").read_text() == "[global]\n"


def test_options_that_would_send_the_install_elsewhere_are_left_out():
    setup = pip_setup.resolve({"global": {"require-virtualenv": "true", "user": "true", "timeout": "60"}})
    assert setup.conf == "[global]\ntimeout = 60\n"


def test_a_named_file_that_does_not_exist_is_one_error_naming_it(tmp_path):
    missing = tmp_path / "etc" / "constraints.txt"
    with pytest.raises(pip_setup.PipSetupError, match=f"names {missing} \\(constraint\\), which is not a readable"):
        pip_setup.resolve({"global": {"constraint": str(missing)}})
    nested = tmp_path / "outer.txt"
    nested.write_text("-r inner.txt\n")
    with pytest.raises(pip_setup.PipSetupError, match=f"names {tmp_path / 'inner.txt'} \\(named in {nested}\\)"):
        pip_setup.resolve({"global": {"requirement": str(nested)}})


def test_the_base_recipe_changes_when_a_named_file_changes(machine):
    """The cap is part of the base: a machine whose constraints change gets a new base."""
    def recipe() -> e2e_image.BaseRecipe:
        setup = pip_setup.resolve({"global": {"constraint": str(machine / "etc/xdg/pip/constraints.txt")}})
        return e2e_image.BaseRecipe("bookworm", "http://mirror.example/debian", ("python3",), ("torch",), setup)

    before = recipe().key()
    assert recipe().key() == before
    (machine / "etc/xdg/pip/more-constraints.txt").write_text("torchvision<=0.30\n")
    assert recipe().key() != before
