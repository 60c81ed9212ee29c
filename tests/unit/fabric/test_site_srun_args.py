"""The srun options a site's training and gate steps need, as profile data with their sources, and
the host question the job scripts ask (python3 -m ddp_launch.sites --site SITE srun-args)."""

from __future__ import annotations

import io

import pytest

from fakes.node import fabric_plan

from ddp_launch.errors import LaunchError
from ddp_launch.fabric.defaults import load_fabric_defaults
from ddp_launch.sites import available_sites, load_site, run

# HPE's ccl_env.sh (HewlettPackard/shs-ccl-docs), which Olivia's NCCL modules export:
# "FI_CXI_RDZV_PROTO=alt_read" and "When running with slurm, the flag --network=disable_rdzv_get
# is required and must be added to the srun command".
DISABLE_RDZV_GET = "--network=disable_rdzv_get"


def test_the_slingshot_defaults_carry_hpes_alt_read_protocol_with_its_source():
    item = next(e for e in load_fabric_defaults("slingshot", {}).env if e.name == "FI_CXI_RDZV_PROTO")
    assert item.value == "alt_read"
    assert "shs-ccl-docs ccl_env.sh" in item.source and DISABLE_RDZV_GET in item.source


@pytest.mark.parametrize("site", [name for name in available_sites({}) if load_site(name, {}).fabric == "slingshot"])
def test_every_slingshot_site_gives_srun_the_flag_that_alt_read_needs(site):
    args = load_site(site, {}).srun_args
    assert [a.value for a in args] == [DISABLE_RDZV_GET]
    assert "shs-ccl-docs ccl_env.sh" in args[0].source and "required" in args[0].source


def test_the_slingshot_sites_are_olivia_and_lumi():
    assert sorted(n for n in available_sites({}) if load_site(n, {}).fabric == "slingshot") == ["lumi", "olivia"]


def test_a_site_off_slingshot_gives_srun_nothing():
    assert load_site("generic", {}).srun_args == () and load_site("raven", {}).srun_args == ()


@pytest.mark.parametrize(("site", "printed"), [("olivia", f"{DISABLE_RDZV_GET}\n"), ("lumi", f"{DISABLE_RDZV_GET}\n"),
                                              ("generic", "")])
def test_the_job_scripts_question_prints_one_option_a_line(site, printed):
    out = io.StringIO()
    assert run(["--site", site, "srun-args"], {}, out) == 0
    assert out.getvalue() == printed


def test_the_site_comes_from_ddp_site_when_not_given():
    out = io.StringIO()
    assert run(["srun-args"], {"DDP_SITE": "olivia"}, out) == 0
    assert out.getvalue() == f"{DISABLE_RDZV_GET}\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["--site", "olivia", "binds"], "sites: argument question: invalid choice: 'binds'"),
    (["srun-args"], "sites: the following arguments are required: --site"),
    (["--site", "nosuchsite", "srun-args"], "unknown site 'nosuchsite'"),
])
def test_a_bad_question_is_a_one_line_error(argv, message):
    with pytest.raises(LaunchError, match=message):
        run(argv, {}, io.StringIO())


# FI_CXI_RDZV_PROTO=alt_read only where the step has srun --network=disable_rdzv_get: the job scripts
# put the site profile's --network into the step's environment as SLURM_NETWORK, which srun reads as
# --network (srun(1), INPUT ENVIRONMENT VARIABLES) and the tasks inherit. libfabric's fi_cxi(7),
# FI_CXI_RDZV_PROTO: "To use an alternate protocol, the CXI driver property rdzv_get_en should be set to 0".

def _slingshot_plan(node, env):
    node.cxi(1)
    return fabric_plan(node, env=env, multi_node=True)


@pytest.mark.parametrize("network", ["disable_rdzv_get", "job_vni,disable_rdzv_get"])
def test_a_step_with_disable_rdzv_get_gets_alt_read(node, network):
    plan = _slingshot_plan(node, {"SLURM_NETWORK": network})
    assert {c.name: c.value for c in plan.changes}["FI_CXI_RDZV_PROTO"] == "alt_read"
    assert not [f for f in plan.findings if f.topic == "rendezvous"]


@pytest.mark.parametrize("env", [{}, {"SLURM_NETWORK": "job_vni"}])
def test_a_step_without_the_flag_keeps_the_default_protocol_and_says_why(node, env):
    plan = _slingshot_plan(node, env)
    assert "FI_CXI_RDZV_PROTO" not in {c.name for c in plan.changes}
    [finding] = [f for f in plan.findings if f.topic == "rendezvous"]
    assert finding.severity == "info"
    assert finding.text.startswith("FI_CXI_RDZV_PROTO=alt_read not set: this step has no srun "
                                   "--network=disable_rdzv_get (SLURM_NETWORK does not name it)")


def test_alt_read_set_by_the_user_or_a_module_in_a_step_without_the_flag_is_a_warning(node):
    # Olivia's NCCL modules export HPE's ccl_env.sh, FI_CXI_RDZV_PROTO=alt_read included.
    plan = _slingshot_plan(node, {"FI_CXI_RDZV_PROTO": "alt_read"})
    [finding] = [f for f in plan.findings if f.topic == "rendezvous"]
    assert finding.severity == "warning" and "add the flag to srun, or unset FI_CXI_RDZV_PROTO" in finding.text
