"""plan_fabric: which variables each fabric gets, that the user's win, and the findings it reports."""

from __future__ import annotations

import pytest

from fakes.node import fabric_plan, node_facts

from ddp_launch.errors import LaunchError
from ddp_launch.fabric import detect_fabric
from ddp_launch.plan import Finding


def as_dict(changes):
    return {c.name: c.value for c in changes}


def changes(node, **kwargs):
    return as_dict(fabric_plan(node, **kwargs).changes)


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda n: n.cxi(2), "slingshot"),
        (lambda n: n.directory("/sys/class/cxi"), "slingshot"),
        (lambda n: n.rdma("mlx5_0", {}, "InfiniBand"), "infiniband"),
        (lambda n: n.net("eth0"), "ethernet"),
    ],
)
def test_detect_fabric_from_devices(node, build, expected):
    build(node)
    assert detect_fabric(node_facts(node)) == expected


SLINGSHOT_EXPECTED = {
    "NCCL_NET": "AWS Libfabric",
    "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_CROSS_NIC": "1",
    "NCCL_PROTO": "^LL128",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "FI_CXI_DISABLE_HOST_REGISTER": "1",
    "FI_MR_CACHE_MONITOR": "userfaultfd",
    "FI_CXI_RDZV_THRESHOLD": "0",
    "FI_CXI_RDZV_GET_MIN": "0",
    "FI_CXI_RDZV_EAGER_SIZE": "0",
    "FI_PROVIDER": "cxi",
    "FI_CXI_RX_MATCH_MODE": "hybrid",
    "FI_CXI_DEFAULT_TX_SIZE": "2048",
    "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def test_olivia_multi_node_gets_the_slingshot_table(node):
    node.cxi(4)
    env = changes(node, site="olivia")
    assert {k: env.get(k) for k in SLINGSHOT_EXPECTED} == SLINGSHOT_EXPECTED


def test_every_change_cites_a_reason(node):
    node.cxi(4)
    for change in fabric_plan(node, site="olivia").changes:
        assert change.reason.strip(), change.name


def test_nccl_net_only_on_multi_node_runs(node):
    node.cxi(4)
    env = changes(node, site="olivia", multi_node=False)
    assert "NCCL_NET" not in env
    assert env["FI_PROVIDER"] == "cxi"


def test_nccl_net_plugin_from_user_suppresses_nccl_net(node):
    node.cxi(4)
    plan = fabric_plan(node, site="olivia", env={"NCCL_NET_PLUGIN": "ofi"})
    names = as_dict(plan.changes)
    assert "NCCL_NET" not in names and "NCCL_NET_PLUGIN" not in names
    assert any("NCCL_NET_PLUGIN" in note for note in plan.notes)


def test_launcher_never_sets_nccl_net_plugin(node):
    node.cxi(4)
    assert "NCCL_NET_PLUGIN" not in changes(node, site="olivia")


def test_user_values_are_kept_and_noted(node):
    node.cxi(4)
    user = {"FI_CXI_RX_MATCH_MODE": "software", "NCCL_CROSS_NIC": "0"}
    plan = fabric_plan(node, site="olivia", env=user)
    names = as_dict(plan.changes)
    assert "FI_CXI_RX_MATCH_MODE" not in names and "NCCL_CROSS_NIC" not in names
    assert any("kept your FI_CXI_RX_MATCH_MODE=software" in note for note in plan.notes)


def test_ll128_disabled_only_on_gh200(node):
    node.cxi(4)
    x86 = changes(node, site="olivia", machine="x86_64")
    generic_arm = changes(node, machine="aarch64")
    assert "NCCL_PROTO" not in x86
    assert "NCCL_PROTO" not in generic_arm


def test_socket_ifname_lists_only_existing_hsn_interfaces(node):
    node.cxi(2)
    env = changes(node)
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1"


def test_no_hsn_interface_leaves_socket_ifname_unset_with_warning(node):
    node.file("/dev/cxi0")
    node.net("eth0", "lo")
    plan = fabric_plan(node, site="olivia")
    assert "NCCL_SOCKET_IFNAME" not in as_dict(plan.changes)
    assert any("no hsn* interface" in note for note in plan.notes)


def test_profile_ifname_used_when_interfaces_cannot_be_listed(node):
    node.file("/dev/cxi0")
    env = changes(node, site="olivia")
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"


def test_user_socket_ifname_that_matches_nothing_is_warned(node):
    node.cxi(2)
    plan = fabric_plan(node, env={"NCCL_SOCKET_IFNAME": "ib0"})
    assert any("matches no interface" in note for note in plan.notes)


def test_expected_fabric_turns_on_nccl_net_logging_to_a_file(node, tmp_path):
    node.cxi(1)
    # The job's name comes from its scheduler's identity (SLURM's job id 77: planner.plan passes it on).
    env = changes(node, env={"DDP_LAUNCH_LOG_DIR": str(tmp_path)}, job_name="77")
    assert env["DDP_EXPECT_FABRIC"] == "slingshot"
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == f"{tmp_path}/nccl-77.%h.%p.log"
    assert "DDP_REQUIRE_FABRIC" not in env


def test_user_nccl_debug_is_not_redirected(node):
    node.cxi(1)
    env = changes(node, env={"NCCL_DEBUG": "WARN"})
    assert "NCCL_DEBUG" not in env and "NCCL_DEBUG_FILE" not in env
    assert env["DDP_EXPECT_FABRIC"] == "slingshot"


def test_require_fabric_is_passed_to_the_trainer(node):
    node.cxi(1)
    env = changes(node, require_fabric=True)
    assert env["DDP_REQUIRE_FABRIC"] == "1"


def test_require_fabric_without_any_fabric_is_an_error(node):
    node.net("eth0")
    with pytest.raises(LaunchError, match="--require-fabric"):
        fabric_plan(node, require_fabric=True)


def test_single_node_expects_no_fabric(node):
    node.cxi(1)
    env = changes(node, multi_node=False)
    assert "DDP_EXPECT_FABRIC" not in env and "NCCL_DEBUG" not in env


def test_nccl_debug_flag_overrides_the_environment(node):
    node.net("eth0")
    env = changes(node, env={"NCCL_DEBUG": "WARN"}, nccl_debug="info")
    assert env["NCCL_DEBUG"] == "INFO"


def test_bad_nccl_debug_level_is_an_error(node):
    with pytest.raises(LaunchError, match="--nccl-debug 'loud'"):
        fabric_plan(node, nccl_debug="loud")


def test_unknown_site_is_an_error(node):
    with pytest.raises(LaunchError, match="unknown site 'atlantis'"):
        fabric_plan(node, site="atlantis")


def test_async_error_handling_is_set_on_every_fabric(node):
    node.net("eth0")
    assert changes(node, multi_node=False)["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


@pytest.mark.parametrize(
    "value, problem",
    [("hsn", False), ("hsn0,hsn9", False), ("=hsn0", False), ("=hsn", True), ("^docker,lo", False), ("ib0", True)],
)
def test_socket_ifname_check_follows_nccl_syntax(value, problem):
    from ddp_launch.fabric.slingshot import check_socket_ifname

    assert (check_socket_ifname(value, ("hsn0", "hsn1", "eth0")) is not None) == problem


def test_log_dir_places_the_nccl_log_beside_torchruns(node, tmp_path):
    node.cxi(1)
    env = changes(node, job_name="77", log_dir="/scratch/logs")
    assert env["NCCL_DEBUG_FILE"] == "/scratch/logs/nccl-77.%h.%p.log"


def test_an_exported_log_dir_variable_still_names_the_nccl_log_place(node):
    node.cxi(1)
    env = changes(node, env={"DDP_LAUNCH_LOG_DIR": "/exported", "TMPDIR": "/tmpdir"}, log_dir="/flag")
    assert env["NCCL_DEBUG_FILE"] == "/exported/nccl-local.%h.%p.log"


def test_findings_are_typed_and_notes_render_them_as_before(node):
    node.cxi(2)
    plan = fabric_plan(node, env={"NCCL_SOCKET_IFNAME": "ib0", "NCCL_CROSS_NIC": "0",
                                  "NCCL_NET": "Socket", "NCCL_NET_PLUGIN": "ofi", "SLURM_NETWORK": "disable_rdzv_get"})
    assert [(f.topic, f.severity) for f in plan.findings] == [
        ("kept", "info"), ("plugin", "warning"), ("kept", "info"), ("kept", "info"), ("interface", "error")]
    assert plan.notes[0].startswith("kept your NCCL_NET=Socket (default would be AWS Libfabric: ")
    assert plan.notes[1] == ("warning: NCCL_NET and NCCL_NET_PLUGIN are both set; NCCL then fails to find "
                             "the network (unset NCCL_NET_PLUGIN)")
    assert plan.notes[4] == ("warning: NCCL_SOCKET_IFNAME=ib0 matches no interface on this node "
                             "(have: hsn0, hsn1)")


def test_a_missing_hsn_interface_is_a_warning_about_the_interface(node):
    node.file("/dev/cxi0")
    node.net("eth0")
    assert Finding("interface", "warning", "Slingshot expected but no hsn* interface exists; "
                   "NCCL_SOCKET_IFNAME left unset") in fabric_plan(node).findings


def test_fi_provider_comes_from_the_slingshot_defaults_on_any_slingshot_site(node):
    node.cxi(1)
    for site in ("olivia", None):
        plan = fabric_plan(node, site=site)
        reasons = [c.reason for c in plan.changes if c.name == "FI_PROVIDER"]
        assert reasons == ["PyTorch on Olivia container script: use the CXI provider, never tcp/verbs"]


def test_site_value_beats_the_fabric_default_and_the_users_beats_both(node, tmp_path):
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "lab.json").write_text(
        '{"schema": 1, "name": "lab", "fabric": "slingshot", "binds": [],'
        ' "env": {"NCCL_CROSS_NIC": {"value": "0", "source": "lab wiki"}}}')
    node.cxi(1)
    site_env = {"DDP_SITES_DIR": str(sites)}
    plan = fabric_plan(node, site="lab", env=site_env)
    assert [(c.value, c.reason) for c in plan.changes if c.name == "NCCL_CROSS_NIC"] == [("0", "site lab: lab wiki")]
    # The fabric defaults still come from the shipped data though DDP_SITES_DIR names another place.
    assert as_dict(plan.changes)["FI_PROVIDER"] == "cxi"
    user = fabric_plan(node, site="lab", env={**site_env, "NCCL_CROSS_NIC": "1"})
    assert "NCCL_CROSS_NIC" not in as_dict(user.changes)


def test_the_sites_library_directories_are_what_the_probe_is_asked(node):
    from ddp_launch.fabric import directories_to_probe
    from ddp_launch.fabric.defaults import read_fabric_data

    asked = directories_to_probe(read_fabric_data("olivia", {}))
    assert asked[:2] == ("/opt/aws-ofi-nccl/lib", "/opt/aws-ofi-nccl/lib64")
    assert "/opt/libfabric/include" in asked
    assert directories_to_probe(read_fabric_data(None, {})) == ()
    # An unknown site is not asked about; the plan refuses it in its turn.
    unknown = read_fabric_data("atlantis", {})
    assert directories_to_probe(unknown) == ()
    with pytest.raises(LaunchError, match="unknown site 'atlantis'"):
        unknown.site_profile()


def test_lumi_sets_no_gdr_level_though_the_slingshot_defaults_do(node):
    # NCCL_NET_GDR_LEVEL=PHB or SYS deadlocks multi-node init on the LAIF ROCm 7.0 image LUMI's profile builds on
    # (lumi-ai-factory/laifs-container-recipes#28, #30); the Slingshot default (HPE's PHB) must not reach it.
    node.cxi(4)
    lumi = fabric_plan(node, site="lumi", machine="x86_64")
    assert "NCCL_NET_GDR_LEVEL" not in as_dict(lumi.changes)
    [finding] = [f for f in lumi.findings if f.topic == "unset"]
    assert finding.severity == "info"
    assert finding.text.startswith("NCCL_NET_GDR_LEVEL left unset (the library's own default): site lumi: left to RCCL")
    assert "laifs-container-recipes#28, #30" in finding.text and "LUMI-AI-Guide PR #97" in finding.text
    assert as_dict(fabric_plan(node, site="olivia").changes)["NCCL_NET_GDR_LEVEL"] == "PHB"


def test_a_users_gdr_level_on_lumi_is_kept_and_warned_about(node):
    node.cxi(4)
    plan = fabric_plan(node, site="lumi", machine="x86_64", env={"NCCL_NET_GDR_LEVEL": "3"})
    assert "NCCL_NET_GDR_LEVEL" not in as_dict(plan.changes)
    [finding] = [f for f in plan.findings if f.topic == "unset"]
    assert finding.severity == "warning"
    assert finding.text.startswith("NCCL_NET_GDR_LEVEL=3 is set, but site lumi: left to RCCL")
    assert finding.text.endswith(": unset it")


def test_a_site_null_value_withholds_any_default_and_a_string_is_still_required_elsewhere(node, tmp_path):
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "lab.json").write_text(
        '{"schema": 1, "name": "lab", "fabric": "slingshot", "binds": [],'
        ' "env": {"FI_MR_CACHE_MONITOR": {"value": null, "source": "lab wiki: the site module sets kdreg2"}}}')
    node.cxi(1)
    plan = fabric_plan(node, site="lab", env={"DDP_SITES_DIR": str(sites)})
    assert "FI_MR_CACHE_MONITOR" not in as_dict(plan.changes)
    assert as_dict(plan.changes)["FI_PROVIDER"] == "cxi"
    from ddp_launch.fabric.defaults import parse_fabric_defaults
    with pytest.raises(LaunchError, match="env X: 'value' and 'source' must be strings"):
        parse_fabric_defaults({"schema": 1, "name": "f", "env": {"X": {"value": None, "source": "s"}}}, "/f/f.json")


def test_gh200_gets_gdr_over_c2c_whatever_the_host_nccls_default(node):
    # NCCL_NET_GDR_C2C defaulted to 0 in NCCL 2.26 and is 1 since 2.27 (NCCL's env.rst): set it, as CSCS does.
    node.cxi(4)
    assert changes(node, site="olivia")["NCCL_NET_GDR_C2C"] == "1"
    assert "NCCL_NET_GDR_C2C" not in changes(node, site="olivia", machine="x86_64")
    assert "NCCL_NET_GDR_C2C" not in changes(node, site="lumi", machine="x86_64")
    assert "NCCL_NET_GDR_C2C" not in changes(node, site="olivia", env={"NCCL_NET_GDR_C2C": "0"})
