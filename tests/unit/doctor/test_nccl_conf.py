"""The settings NCCL takes from /etc/nccl.conf, ~/.nccl.conf and $NCCL_CONF_FILE, by NCCL's own rules
(NVIDIA/nccl src/misc/param.cc; env.rst, NCCL_CONF_FILE), and the doctor's line on them."""
from __future__ import annotations

import pytest
from test_doctor import JOB, FakeProbes, doctor, olivia_node

from ddp_contract import nccl_conf


def lines(files, env, version="2.27.7", root="/"):
    return [(line.why, line.name, line.value, line.effect)
            for line in nccl_conf.lines_of(nccl_conf.read_files(nccl_conf.files_nccl_reads(env, version), root), env)]


def test_the_environment_wins_then_the_first_file_and_nothing_is_trimmed(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home/.nccl.conf").write_text(
        "# a comment\nNCCL_IB_TIMEOUT=22\nNCCL_DEBUG=TRACE\nNCCL_ALGO = Ring\nnot a setting\nNCCL_PROTO=Simple\r\n")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nccl.conf").write_text("NCCL_IB_TIMEOUT=14\nNCCL_NET_GDR_LEVEL=SYS\n")
    env = {"HOME": "/home", "NCCL_DEBUG": "INFO"}
    assert lines(None, env, root=str(tmp_path)) == [
        ("~/.nccl.conf", "NCCL_IB_TIMEOUT", "22", nccl_conf.APPLIES),
        ("~/.nccl.conf", "NCCL_DEBUG", "TRACE", nccl_conf.ENVIRONMENT_WINS),
        ("~/.nccl.conf", "NCCL_ALGO", " Ring", nccl_conf.NEVER_READ),
        ("~/.nccl.conf", "NCCL_PROTO", "Simple", nccl_conf.APPLIES),   # a CRLF file's \r is dropped
        ("/etc/nccl.conf", "NCCL_IB_TIMEOUT", "14", nccl_conf.EARLIER_FILE_WINS),
        ("/etc/nccl.conf", "NCCL_NET_GDR_LEVEL", "SYS", nccl_conf.APPLIES),
    ]


@pytest.mark.parametrize(("version", "first"), [
    ("2.23.4", ("/job/nccl.conf", "NCCL_CONF_FILE")),       # read since 2.23 (env.rst)
    ("2.22.3", ("/home/.nccl.conf", "~/.nccl.conf")),       # older: ~/.nccl.conf, whatever NCCL_CONF_FILE says
    (None, ("/job/nccl.conf", "NCCL_CONF_FILE")),
])
def test_nccl_conf_file_replaces_the_home_file_from_2_23_on(version, first):
    env = {"HOME": "/home", "NCCL_CONF_FILE": "/job/nccl.conf"}
    assert nccl_conf.files_nccl_reads(env, version) == (first, ("/etc/nccl.conf", "/etc/nccl.conf"))
    assert nccl_conf.files_nccl_reads({}, version) == (("/etc/nccl.conf", "/etc/nccl.conf"),)


def test_the_doctor_lists_what_applies_and_names_a_line_against_the_site_profile(node):
    olivia_node(node)
    node.file("/home/u/.nccl.conf", "NCCL_IB_USE_INLINE=1\nNCCL_CROSS_NIC=0\nNCCL_SOCKET_IFNAME = ib0\n")
    code, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {**JOB, "HOME": "/home/u"})
    check = checks["nccl config files"]
    assert check["status"] == "WARN"
    where = "~/.nccl.conf (/home/u/.nccl.conf)"
    assert check["detail"] == (
        f"{where} line 2: NCCL_CROSS_NIC=0 conflicts with the fabric default's NCCL_CROSS_NIC=1 (HPE shs-ccl-docs "
        "ccl_env.sh (exported by Olivia's NCCL modules); CSCS nccl_env_vars (hpc-ai-envs uses 0)); in this job the "
        "environment's value wins, NCCL run without ddp-launch takes the file's; "
        f"{where} line 3: 'NCCL_SOCKET_IFNAME = ib0' is {nccl_conf.NEVER_READ}; "
        f"{where} line 1: NCCL_IB_USE_INLINE=1 (applies)")
    assert check["fix"].startswith("edit or remove the line")
    assert code == 0  # a warning: the job's own values win over the file's


def test_an_nccl_conf_file_the_bound_nccl_ignores_is_named(node):
    olivia_node(node)  # the bound NCCL says 2.26.6 (FakeProbes); the image's torch does not say
    node.file("/job/nccl.conf", "NCCL_IB_TIMEOUT=22\n")
    torch = {"version": "2.7.0", "cuda": "12.9", "cuda_device_count": 4}
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {**JOB, "NCCL_CONF_FILE": "/job/nccl.conf"},
                          FakeProbes(torch=torch))
    assert checks["nccl config files"]["detail"] == "NCCL_CONF_FILE=/job/nccl.conf line 1: NCCL_IB_TIMEOUT=22 (applies)"
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {**JOB, "NCCL_CONF_FILE": "/job/missing.conf",
                                                                    "HOME": "/home/u"}, FakeProbes(torch=torch))
    assert checks["nccl config files"]["status"] == "WARN"
    assert checks["nccl config files"]["detail"] == ("NCCL_CONF_FILE=/job/missing.conf names no readable file, so "
                                                     "NCCL 2.26.6 reads nothing from it, nor ~/.nccl.conf")


def test_no_file_at_all_is_said_with_where_nccl_looks(node):
    olivia_node(node)
    _, checks, _ = doctor(node, ["--site", "olivia", "--offline"], {**JOB, "HOME": "/home/u"})
    assert checks["nccl config files"] == {"name": "nccl config files", "status": "OK", "fix": "",
                                           "detail": "none: NCCL looks for ~/.nccl.conf (/home/u/.nccl.conf), "
                                                     "/etc/nccl.conf"}
