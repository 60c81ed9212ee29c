"""The one reader of the JSON data files' objects (ddp_contract.records): a field's default, its rules in
order, its name in the record, and one error naming the file and the key; the site profiles, GPU
vendors and fabric defaults are all read with it (their messages: test_site_profile_field_types.py,
test_accelerators.py, test_fabric_defaults.py)."""

from __future__ import annotations

import pytest

from ddp_contract.records import (FLAG, TEXT, WORDS, Field, Reader, exactly, one_of, optional, regular_expression,
                                  showing_value, when_given)
from ddp_launch.errors import LaunchError
from ddp_launch.fabric.defaults import parse_fabric_defaults
from ddp_launch.sites import parse_profile

READER = Reader("lab data", "/x/lab.json")
FIELDS = (
    Field("name", (TEXT,)),
    Field("words", (WORDS,), convert=tuple, attribute="argv"),
    Field("mode", (one_of(("fast", "slow")),), "fast"),
    Field("note", (when_given(TEXT),), None, label="'lab.note'"),
)


def test_a_record_holds_each_fields_value_its_default_where_absent_and_its_own_name():
    assert READER.record({"name": "a", "words": ["x", "y"]}, FIELDS) == {
        "name": "a", "argv": ("x", "y"), "mode": "fast", "note": None}


@pytest.mark.parametrize("data, message", [
    ({}, "'name' must be a non-empty string"),                       # required: absent is judged as None
    ({"name": "a", "words": "x"}, "'words' must be a non-empty list of strings"),
    ({"name": "a", "words": ["x"], "mode": "medium"}, "'mode' must be one of fast, slow, got 'medium'"),
    ({"name": "a", "words": ["x"], "note": ""}, "'lab.note' must be a non-empty string when given"),
])
def test_a_wrong_field_is_one_error_naming_the_file_and_the_key(data, message):
    with pytest.raises(LaunchError) as error:
        READER.record(data, FIELDS)
    assert str(error.value) == f"bad lab data /x/lab.json: {message}"


def test_a_label_names_a_key_inside_its_object():
    with pytest.raises(LaunchError, match=r": 'driver\.name' must be a non-empty string$"):
        READER.record({"name": 5}, FIELDS, "'driver.{}'")


def test_the_rules_are_checked_in_order_and_the_first_broken_one_speaks():
    field = Field("file", (TEXT, regular_expression))
    with pytest.raises(LaunchError, match="'file' must be a non-empty string"):
        READER.value({"file": 5}, field)
    with pytest.raises(LaunchError, match=r"'file' is not a regular expression \("):
        READER.value({"file": "("}, field)


def test_the_rules_say_what_the_value_must_be():
    assert FLAG(1) == "must be true or false" and FLAG(True) is None
    assert exactly(("a", "b"), '{"a": ..., "b": ...}')({"a": 1}) == 'must be {"a": ..., "b": ...}'
    assert optional(TEXT)(None) is None and optional(TEXT)("") == "must be a non-empty string"
    assert showing_value("must be small", lambda value: value < 2)(3) == "must be small, got 3"


def test_an_unknown_key_is_named_with_the_keys_there_may_be():
    with pytest.raises(LaunchError, match=r"lab has unknown key\(s\) colour; allowed: mode, name, note, words$"):
        READER.known_keys({"name": "a", "colour": "red"}, FIELDS, "lab")


def test_an_env_table_keeps_the_files_order_and_its_optional_keys():
    table = {"B_VAR": {"value": "1", "source": "s"}, "A_VAR": {"value": "2", "source": "s", "when": "multi_node"}}
    assert [name for name, _ in READER.env_table(table, optional_keys=("when",))] == ["B_VAR", "A_VAR"]
    with pytest.raises(LaunchError, match=r'env A_VAR must be \{"value": "...", "source": "..."\}$'):
        READER.env_table(table)


def test_a_site_bind_with_a_misspelt_key_is_told_the_keys_it_may_have():
    bind = {"name": "fabric", "glob": "/opt/*", "target": "/opt/f", "source": "s", "libray_path": ["/opt/f/lib"]}
    with pytest.raises(LaunchError, match=r"binds\[0\] has unknown key\(s\) libray_path; allowed: env, glob, hint, "
                                          r"include_path, library_path, name, order, required, source, target$"):
        parse_profile({"schema": 1, "name": "lab", "fabric": "auto", "binds": [bind]}, "/x/lab.json")


def test_a_host_library_names_the_one_key_that_is_wrong():
    library = {"label": "x", "file": "x", "kind": "plain", "required": True, "fix": "", "source": "s"}
    with pytest.raises(LaunchError, match=r"host_libraries\[0\]: 'fix' must be a non-empty string$"):
        parse_fabric_defaults({"schema": 1, "name": "lab", "host_libraries": [library]}, "/x/fabrics/lab.json")
