"""SLURM hostlist expansion: the grammar table, malformed input, properties, and scontrol itself."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_launch.errors import LaunchError
from ddp_launch.schedulers.nodelist import expand_nodelist


@pytest.mark.parametrize("hostlist, expected", [
    ("node1", ["node1"]),
    ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
    ("raven[0123,0124]", ["raven0123", "raven0124"]),
    ("olivia-gh[001-002]", ["olivia-gh001", "olivia-gh002"]),
    ("n[8-10]", ["n8", "n9", "n10"]),                      # no padding: width of "8"
    ("nid[008-010]", ["nid008", "nid009", "nid010"]),      # padding: width of "008"
    ("a[1-03]", ["a1", "a2", "a3"]),                       # width comes from the first bound
    ("nid00[1-3]-hsn", ["nid001-hsn", "nid002-hsn", "nid003-hsn"]),
    ("x[010-012,7]", ["x010", "x011", "x012", "x7"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("a[1-2][3-4]", ["a13", "a14", "a23", "a24"]),
    # Three or more groups: the last varies fastest, then the first, the second, ...
    # Recorded from `scontrol show hostnames` (SLURM 22.05.8) and checked against
    # _push_range_list in SchedMD/slurm src/common/hostlist.c.
    ("a[1-2]b[1-2][1-2]", ["a1b11", "a1b12", "a2b11", "a2b12", "a1b21", "a1b22", "a2b21", "a2b22"]),
    ("a[1-2]b[1-2]c[1-2]", ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"]),
    ("a[1-3][1-2][1-2][1-2]", ["a1111", "a1112", "a2111", "a2112", "a3111", "a3112",
                               "a1211", "a1212", "a2211", "a2212", "a3211", "a3212",
                               "a1121", "a1122", "a2121", "a2122", "a3121", "a3122",
                               "a1221", "a1222", "a2221", "a2222", "a3221", "a3222"]),
    ("1.2.3.[100-102]", ["1.2.3.100", "1.2.3.101", "1.2.3.102"]),
    ("master-node,node[01-05]", ["master-node", "node01", "node02", "node03", "node04", "node05"]),
    ("alpha, host[5-6], gamma", ["alpha", "host5", "host6", "gamma"]),
    # SLURM's own documentation example (scontrol show hostnames "tux[1,3-4],snowflake[1-3]")
    ("tux[1,3-4],snowflake[1-3]", ["tux1", "tux3", "tux4", "snowflake1", "snowflake2", "snowflake3"]),
])
def test_expand_nodelist_follows_slurm_grammar(hostlist, expected):
    assert list(expand_nodelist(hostlist)) == expected


@pytest.mark.parametrize("hostlist", [
    "", "a[1-", "a]1[", "a[1-2", "a[[1]]", "a[]", "a[x-3]", "a[3-1]", "a[1-]", "a[-2]",
    "a,,b", "a,", "a[1,,2]", "a b", "a[1-2 ]", "a[²]",
])
def test_malformed_nodelist_is_an_error_naming_variable_and_value(hostlist):
    with pytest.raises(LaunchError) as error:
        expand_nodelist(hostlist, "SLURM_JOB_NODELIST")
    assert f"SLURM_JOB_NODELIST={hostlist!r}" in str(error.value)
    assert "node[01-04,07]" in str(error.value)  # says what a good one looks like


def test_absurd_range_is_refused_instead_of_eating_memory():
    with pytest.raises(LaunchError, match="more than"):
        expand_nodelist("n[1-999999999]")


@pytest.mark.parametrize("hostlist, count", [
    ("n[1-10000]x[1-10000]", 10**8),         # each range is small, their product is not
    ("a[1-300],b[1-300][1-300]", 300 + 90000),
    ("n[1-65536],extra", 65537),
])
def test_a_hostlist_over_slurms_limit_is_refused_from_its_size_before_any_name_is_built(hostlist, count):
    tracemalloc.start()
    try:
        with pytest.raises(LaunchError) as error:
            expand_nodelist(hostlist, "SLURM_JOB_NODELIST")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"names {count} hosts, more than SLURM's limit of 65536" in str(error.value)
    assert peak < 1_000_000, f"{peak} bytes used to refuse it"


def test_a_hostlist_at_slurms_limit_still_expands():
    hosts = expand_nodelist("n[1-65536]")
    assert (len(hosts), hosts[0], hosts[-1]) == (65536, "n1", "n65536")


# -- property test: generate a hostlist from a structure, compare with the structure's own product --

# Host names start with a letter; '-' and digits may follow.
_prefix = st.tuples(st.sampled_from("abcxyz"), st.text(alphabet="abcxyz-0", max_size=3)).map("".join)


@st.composite
def _ranges(draw):
    """One bracket group as text and the names it stands for."""
    terms, names = [], []
    for _ in range(draw(st.integers(1, 3))):
        width = draw(st.integers(1, 3))
        first = draw(st.integers(0, 10 ** width - 1))
        last = draw(st.integers(first, min(first + 4, 10 ** width - 1)))
        low = str(first).zfill(width)
        terms.append(low if first == last else f"{low}-{last}")
        names.extend(str(n).zfill(len(low)) for n in range(first, last + 1))
    return "[" + ",".join(terms) + "]", names


@st.composite
def hostlists(draw, suffix=True, max_groups=2):
    """A hostlist and its names; `expected` is only right for up to two groups an item,
    where SLURM's order is the plain product (three or more: scontrol is the oracle)."""
    texts, expected = [], []
    for _ in range(draw(st.integers(1, 3))):
        parts_text, parts_names = [], []
        for _ in range(draw(st.integers(0, max_groups))):
            literal = draw(_prefix)
            group_text, group_names = draw(_ranges())
            parts_text += [literal, group_text]
            parts_names += [[literal], group_names]
        tail = draw(_prefix) if (suffix or not parts_text) else ""
        texts.append("".join(parts_text) + tail)
        expected.extend("".join(c) for c in itertools.product(*parts_names, [tail]))
    return ",".join(texts), expected


@settings(max_examples=300, deadline=None)
@given(hostlists())
def test_expansion_round_trips_generated_hostlists(case):
    text, expected = case
    assert list(expand_nodelist(text)) == expected


# -- the real thing: scontrol, where installed (it needs only a config file, no controller) --

def _scontrol(tmp_path_factory):
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol not installed (Debian package slurm-wlm)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=unit\nSlurmctldHost=localhost\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def hostnames(hostlist: str):
        done = subprocess.run(["scontrol", "show", "hostnames", hostlist], env=env,
                              capture_output=True, text=True, timeout=10)
        return done.returncode, done.stdout.split(), done.stdout + done.stderr
    return hostnames


@pytest.fixture(scope="module")
def scontrol_hostnames(tmp_path_factory):
    return _scontrol(tmp_path_factory)


# Generated without suffixes after brackets (`nid00[1-3]-hsn`): SLURM 22.05's scontrol
# rejects them as an invalid hostlist, so the grammar table above is their oracle.
# Up to three groups an item, where SLURM's order is no longer the plain product.
@settings(max_examples=60, deadline=None)
@given(hostlists(suffix=False, max_groups=3))
def test_expansion_matches_scontrol_show_hostnames(scontrol_hostnames, case):
    text, _ = case
    code, names, output = scontrol_hostnames(text)
    assert code == 0 and "Invalid" not in output, output
    assert list(expand_nodelist(text)) == names
