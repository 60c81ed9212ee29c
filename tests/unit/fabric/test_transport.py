"""Which network NCCL chose, from real-looking NCCL INFO lines; loud when it fell back to sockets."""

from __future__ import annotations

import pytest

from ddp_contract.nccl_log import check_nccl_transport, detect_nccl_transport, nccl_log_paths, sockets_warning

OFI_LOG = """\
nid001234:12345:12345 [0] NCCL INFO cudaDriverVersion 12080
nid001234:12345:12345 [0] NCCL INFO NCCL version 2.26.6+cuda12.8
nid001234:12345:12345 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v9)
nid001234:12345:12345 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0
nid001234:12345:12345 [0] NCCL INFO NET/OFI Selected provider is cxi, fabric is cxi (found 4 nics)
nid001234:12345:12345 [0] NCCL INFO Using network AWS Libfabric
""".splitlines(keepends=True)

NO_PLUGIN_LOG = """\
nid001234:12345:12345 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
nid001234:12345:12345 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory : when loading libnccl-net.so
nid001234:12345:12345 [0] NCCL INFO NET/IB : No device found.
nid001234:12345:12345 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.100.0.12<0> [1]hsn1:10.100.0.13<0>
nid001234:12345:12345 [0] NCCL INFO Using network Socket
""".splitlines(keepends=True)

OFI_MISMATCH_LOG = """\
nid001234:12345:12345 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v9)
nid001234:12345:12345 [0] NCCL WARN NET/OFI Couldn't find any optimal provider
nid001234:12345:12345 [0] NCCL INFO Using network Socket
""".splitlines(keepends=True)

ROCE_LOG = """\
runai-pod-0:77:77 [0] NCCL INFO NET/IB : Using [0]mlx5_bond_0:1/RoCE [RO]; OOB net1:172.18.128.3<0>
runai-pod-0:77:77 [0] NCCL INFO Using network IB
""".splitlines(keepends=True)


def test_ofi_plugin_is_detected():
    transport = detect_nccl_transport(OFI_LOG)
    assert transport.network == "AWS Libfabric"
    assert transport.plugin == "AWS Libfabric"
    assert not transport.is_socket


def test_socket_fallback_is_detected_with_its_cause():
    transport = detect_nccl_transport(NO_PLUGIN_LOG)
    assert transport.is_socket
    assert "No plugin found" in transport.plugin_problem


def test_roce_is_ib():
    assert detect_nccl_transport(ROCE_LOG).network == "IB"


def test_no_warning_when_the_fabric_is_used():
    assert sockets_warning(detect_nccl_transport(OFI_LOG), "slingshot", {}) is None


def test_warning_names_missing_plugin():
    message = sockets_warning(detect_nccl_transport(NO_PLUGIN_LOG), "slingshot", {"NCCL_NET": "AWS Libfabric"})
    assert message.startswith("WARNING: NCCL is using TCP sockets although slingshot is expected")
    assert "libnccl-net.so) was not found" in message


def test_warning_names_libfabric_problem():
    message = sockets_warning(detect_nccl_transport(OFI_MISMATCH_LOG), "slingshot", {})
    assert "libfabric/OFI error" in message and "Couldn't find any optimal provider" in message


def test_warning_names_unset_nccl_net():
    lines = ["h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v9)\n", "h:1:1 [0] NCCL INFO Using network Socket\n"]
    assert "NCCL_NET is unset" in sockets_warning(detect_nccl_transport(lines), "slingshot", {})


def write_log(tmp_path, lines, host="nid001234", pid=4242):
    (tmp_path / f"nccl-9.{host}.{pid}.log").write_text("".join(lines))
    return {"DDP_EXPECT_FABRIC": "slingshot", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(tmp_path / "nccl-9.%h.%p.log")}


def test_check_reads_this_process_log(tmp_path):
    env = write_log(tmp_path, OFI_LOG)
    ok, message = check_nccl_transport(env, hostname="nid001234.olivia.sigma2.no", pid=4242)
    assert ok and message == "NCCL network: AWS Libfabric via plugin AWS Libfabric (slingshot expected)"


def test_check_warns_on_sockets_but_continues(tmp_path):
    env = write_log(tmp_path, NO_PLUGIN_LOG)
    ok, message = check_nccl_transport(env, hostname="nid001234", pid=4242)
    assert ok and message.startswith("WARNING: NCCL is using TCP sockets")


def test_check_fails_on_sockets_when_fabric_required(tmp_path):
    env = dict(write_log(tmp_path, NO_PLUGIN_LOG), DDP_REQUIRE_FABRIC="1")
    ok, message = check_nccl_transport(env, hostname="nid001234", pid=4242)
    assert not ok and message.startswith("error (--require-fabric): NCCL is using TCP sockets")


def test_check_without_expectation_is_ok():
    assert check_nccl_transport({}) == (True, "no high-speed fabric expected; NCCL transport not checked")


def test_check_without_a_log_says_so(tmp_path):
    env = {"DDP_EXPECT_FABRIC": "infiniband", "NCCL_DEBUG_FILE": str(tmp_path / "x.%h.%p.log")}
    ok, message = check_nccl_transport(env, hostname="h", pid=1)
    assert ok and "cannot tell which network NCCL chose" in message


@pytest.mark.parametrize("host, expected", [("nid1.cluster.org", ("/l/nid1.7", "/l/nid1.cluster.org.7")), ("nid1", ("/l/nid1.7",))])
def test_log_paths_fill_host_and_pid(host, expected):
    assert nccl_log_paths("/l/%h.%p", host, 7) == expected


# A RoCE pod that lost its RDMA device: NCCL's IB verbs transport finds nothing. NCCL logs
# "No plugin found" on every node without a net plugin, RoCE ones included (the plugin is
# optional: NCCL's net plugin docs, ext-net/README.md), so that line is no cause on RoCE.
ROCE_FALLBACK_LOG = """\
runai-pod-0:77:77 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
runai-pod-0:77:77 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory : when loading libnccl-net.so
runai-pod-0:77:77 [0] NCCL INFO NET/IB : No device found.
runai-pod-0:77:77 [0] NCCL INFO NET/Socket : Using [0]eth0:10.244.3.17<0>
runai-pod-0:77:77 [0] NCCL INFO Using network Socket
""".splitlines(keepends=True)


def test_roce_fallback_names_the_missing_rdma_device_not_the_ofi_plugin():
    message = sockets_warning(detect_nccl_transport(ROCE_FALLBACK_LOG), "infiniband", {})
    assert message.startswith("WARNING: NCCL is using TCP sockets although infiniband is expected")
    assert "NET/IB : No device found" in message and "rdma/rdma=1" in message
    assert "aws-ofi" not in message and "libnccl-net" not in message and "OFI" not in message


def test_roce_fallback_with_ib_disabled_names_the_variable():
    message = sockets_warning(detect_nccl_transport(ROCE_FALLBACK_LOG), "infiniband", {"NCCL_IB_DISABLE": "1"})
    assert "NCCL_IB_DISABLE=1" in message and "aws-ofi" not in message


def test_slingshot_fallback_still_names_the_plugin():
    message = sockets_warning(detect_nccl_transport(NO_PLUGIN_LOG), "slingshot", {"NCCL_NET": "AWS Libfabric"})
    assert "aws-ofi-nccl" in message and "rdma/rdma" not in message


def test_on_ethernet_sockets_are_reported_not_warned(tmp_path):
    (tmp_path / "nccl-9.node1.4242.log").write_text("".join(ROCE_FALLBACK_LOG))
    env = {"DDP_EXPECT_FABRIC": "ethernet", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(tmp_path / "nccl-9.%h.%p.log")}
    assert check_nccl_transport(env, hostname="node1", pid=4242) == (True, "NCCL network: Socket (ethernet expected)")
