"""`ddp-launch binds` binds the host libraries that bound host libraries need, resolved as ld.so does.

Real cc-built shared objects in a fake Olivia host tree (elf_tree.py); ld.so's order is
the one ld.so(8) documents ("Rpath token expansion", search order of DT_RPATH,
LD_LIBRARY_PATH, DT_RUNPATH, ld.so.cache, default paths).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from fakes.elf_tree import build_fake_olivia_host, build_library, write_minimal_elf

from ddp_launch import binds as binds_cli
from ddp_launch.elf import read_elf
from ddp_launch.errors import LaunchError
from ddp_launch.libclosure import (
    HostSearch, SharedObject, ld_so_conf_dirs, load_image_libraries, resolve_needed, search_dirs,
)
from ddp_launch.sites import parse_profile

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def built_host(tmp_path_factory) -> dict:
    return build_fake_olivia_host(tmp_path_factory.mktemp("built") / "host")


@pytest.fixture
def host(built_host, tmp_path) -> dict:
    """A private copy of the built tree, so a test may remove or add files."""
    root = tmp_path / "host"
    shutil.copytree(built_host["root"], root, symlinks=True)
    moved = {name: root / path.relative_to(built_host["root"]) for name, path in built_host["libraries"].items()}
    return dict(built_host, root=root, libraries=moved)


def run_binds(root: Path, env=None, extra=()):
    out, err = io.StringIO(), io.StringIO()
    code = binds_cli.run(["--site", "olivia", "--root", str(root), *extra], env or {}, out, err)
    return code, out.getvalue().strip().split(","), err.getvalue()


def test_closure_is_found_transitively_and_bound_as_single_files(host):
    code, value, err = run_binds(host["root"])
    assert code == 0
    for soname, (path, needed_by) in host["closure"].items():
        assert f"{host['root']}{path}:/opt/host-libs/{soname}" in value
        assert f"ddp-launch binds: added {host['root']}{path} -> /opt/host-libs/{soname} (needed by {needed_by})" in err
    added = [entry for entry in value if ":/opt/host-libs/" in entry and not entry.endswith("/libcxi.so.1")]
    assert len(added) == len(host["closure"])


def test_dependency_found_only_through_runpath_origin(host):
    _, value, _ = run_binds(host["root"])
    assert f"{host['root']}/opt/cray/libfabric/2.3.1/private/libfakeatomic.so.1:/opt/host-libs/libfakeatomic.so.1" in value


def test_libraries_the_binds_already_carry_are_not_bound_again(host):
    _, value, _ = run_binds(host["root"])
    targets = [entry.split(":")[1] for entry in value]
    assert "/opt/host-libs/libfabric.so.1" not in targets  # in the bound libfabric lib64
    assert targets.count("/opt/host-libs/libcxi.so.1") == 1


def test_image_provided_libc_is_neither_bound_nor_reported(host):
    assert "libc.so.6" in read_elf(str(host["libraries"]["libcxi.so.1"])).needed
    _, value, err = run_binds(host["root"])
    assert not any("libc.so" in entry for entry in value)
    assert "libc.so.6" not in err


def test_missing_dependency_is_a_warning_naming_who_needs_it(host):
    (host["root"] / "opt/fakevendor/lib64/libfakeudev.so.1").unlink()
    code, value, err = run_binds(host["root"], extra=["--quiet"])
    assert code == 0
    assert ("ddp-launch binds: warning: libfakeudev.so.1 (needed by libfakehwloc.so.15) not found on this host; "
            "not bound, so the image must provide it") in err.splitlines()
    assert not any("libfakeudev" in entry for entry in value)
    assert f"{host['root']}/opt/fakevendor/hwloc/lib/libfakehwloc.so.15:/opt/host-libs/libfakehwloc.so.15" in value


def test_stdout_is_only_the_bind_value(host):
    code, value, err = run_binds(host["root"])
    assert all(":" in entry and "binds" not in entry for entry in value)
    assert "added" in err


def test_ld_library_path_comes_before_ld_so_conf(host):
    """ld.so(8): LD_LIBRARY_PATH is searched before the cache built from /etc/ld.so.conf."""
    module = build_library(host["root"] / "cluster/software/udev/lib/libfakeudev.so.1", "libfakeudev.so.1")
    _, value, _ = run_binds(host["root"], {"LD_LIBRARY_PATH": "/cluster/software/udev/lib"})
    assert f"{module}:/opt/host-libs/libfakeudev.so.1" in value


def test_incompatible_candidate_is_skipped_like_ld_so_does(host):
    """A 32-bit (or other machine's) file of the right name earlier in the path is passed over."""
    write_minimal_elf(host["root"] / "cluster/software/udev32/libfakeudev.so.1", elf_class=32, machine=3,
                      soname="libfakeudev.so.1")
    _, value, _ = run_binds(host["root"], {"LD_LIBRARY_PATH": "/cluster/software/udev32"})
    assert f"{host['root']}/opt/fakevendor/lib64/libfakeudev.so.1:/opt/host-libs/libfakeudev.so.1" in value


def test_rpath_is_ignored_when_the_object_has_a_runpath(tmp_path):
    """ld.so(8): DT_RPATH is used only if DT_RUNPATH is absent; then the loaders' DT_RPATH follow."""
    loader = SharedObject("/opt/app/lib/libapp.so", read_elf(str(write_minimal_elf(tmp_path / "a.so", rpath=("/loader/rpath",)))))
    both = read_elf(str(write_minimal_elf(tmp_path / "b.so", rpath=("/own/rpath",), runpath=("$ORIGIN/run",))))
    only_rpath = read_elf(str(write_minimal_elf(tmp_path / "c.so", rpath=("$ORIGIN/../r",))))
    search = HostSearch("/", ("/ld/library/path",), ("/conf/dir",))

    with_runpath = search_dirs(SharedObject("/x/lib/libb.so", both, (loader,)), search)
    assert with_runpath[:3] == ("/ld/library/path", "/x/lib/run", "/conf/dir")
    assert "/own/rpath" not in with_runpath and "/loader/rpath" not in with_runpath

    without = search_dirs(SharedObject("/x/lib/libc.so", only_rpath, (loader,)), search)
    assert without[:4] == ("/x/lib/../r", "/loader/rpath", "/ld/library/path", "/conf/dir")
    assert without[4:6] == ("/lib64", "/usr/lib64")


def test_lib_token_and_braces_expand(tmp_path):
    info = read_elf(str(write_minimal_elf(tmp_path / "a.so", rpath=("${ORIGIN}/../$LIB", "/opt/$UNKNOWN"))))
    dirs = search_dirs(SharedObject("/opt/pkg/bin/liba.so", info), HostSearch("/", (), ()))
    assert dirs[0] == "/opt/pkg/bin/../lib64"
    assert not any("UNKNOWN" in d for d in dirs)  # ld.so drops an entry with a token it cannot expand


def test_ld_so_conf_includes_relative_globs_and_comments(tmp_path):
    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf").write_text("/first/lib # trailing comment\ninclude ld.so.conf.d/*.conf\nhwcap 1 nosegneg\n/last/lib/\n")
    (tmp_path / "etc/ld.so.conf.d/b.conf").write_text("/b/lib\n")
    (tmp_path / "etc/ld.so.conf.d/a.conf").write_text("# vendor\n/a/lib\ninclude /etc/ld.so.conf\n")
    assert ld_so_conf_dirs(str(tmp_path)) == ("/first/lib", "/a/lib", "/b/lib", "/last/lib")


def test_resolution_under_the_probe_root_never_touches_the_real_system(host):
    needer = SharedObject("/usr/lib64/libcxi.so.1", read_elf(str(host["libraries"]["libcxi.so.1"])))
    search = HostSearch(str(host["root"]), (), ld_so_conf_dirs(str(host["root"])))
    assert resolve_needed("libc.so.6", needer, search) is None  # the real /lib/x86_64-linux-gnu/libc.so.6 is outside
    found = resolve_needed("libfakenl-3.so.200", needer, search)
    assert found.path == "/usr/lib64/libfakenl-3.so.200" and found.loaders == (needer,)


def test_site_without_closure_binds_nothing_more(host):
    sites = host["root"].parent / "sites"
    shutil.copytree(REPO / "containers" / "sites", sites)
    data = json.loads((sites / "olivia.json").read_text())
    del data["closure"]
    (sites / "olivia.json").write_text(json.dumps(data))
    _, value, err = run_binds(host["root"], {"DDP_SITES_DIR": str(sites)})
    assert not any(entry.endswith(("libfakenl-3.so.200", "libfakejson.so.5")) for entry in value)
    assert "added" not in err


def test_closure_target_must_be_on_a_library_path():
    data = json.loads((REPO / "containers/sites/olivia.json").read_text())
    data["closure"]["target"] = "/opt/elsewhere"
    with pytest.raises(LaunchError, match="'closure' target /opt/elsewhere is on no bind's library_path"):
        parse_profile(data, "olivia.json")


def test_image_library_list_names_a_source_for_each_entry():
    entries = load_image_libraries({})
    patterns = {entry.pattern for entry in entries}
    assert {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libcuda.so.1", "ld-linux*.so*"} <= patterns
    assert all(entry.source for entry in entries)


def test_missing_image_library_list_is_one_error(host, tmp_path):
    sites = tmp_path / "sites"
    sites.mkdir()
    shutil.copy(REPO / "containers/sites/olivia.json", sites)
    with pytest.raises(LaunchError, match=r"image/provided-libraries.json not found beside the site profiles"):
        run_binds(host["root"], {"DDP_SITES_DIR": str(sites)})
