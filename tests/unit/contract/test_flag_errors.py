"""The one argparse error rule of ddp-launch, ddp-train and ddp-bench: a bad flag raises the tool's
own error type (which its main() prints as one line, exit 2) instead of argparse's usage and exit."""

from __future__ import annotations

import pytest

from ddp_contract.flag_errors import OneLineErrorParser


class ToolError(Exception):
    pass


class ToolParser(OneLineErrorParser):
    usage_error = ToolError


def test_a_bad_flag_raises_the_tools_error_and_prints_nothing(capsys):
    parser = ToolParser(prog="tool")
    parser.add_argument("--epochs", type=int)
    with pytest.raises(ToolError, match="^argument --epochs: invalid int value: 'two'$"):
        parser.parse_args(["--epochs", "two"])
    assert capsys.readouterr() == ("", "")


def test_abbreviations_are_refused_unless_the_tool_allows_them():
    parser = ToolParser(prog="tool")
    parser.add_argument("--epochs", type=int)
    with pytest.raises(ToolError, match="^unrecognized arguments: --epo 2$"):
        parser.parse_args(["--epo", "2"])


def test_a_subcommands_bad_flag_raises_the_same_error():
    parser = ToolParser(prog="tool")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("report").add_argument("--out", required=True)
    with pytest.raises(ToolError, match="^the following arguments are required: --out$"):
        parser.parse_args(["report"])


def test_the_subcommand_is_named_first_and_the_hint_follows_an_unknown_flag():
    parser = ToolParser(prog="tool binds", subcommand="binds", hint="see tool binds --help")
    parser.add_argument("--site")
    with pytest.raises(ToolError, match=r"^binds: unrecognized arguments: --sit x \(see tool binds --help\)$"):
        parser.parse_args(["--sit", "x"])
    with pytest.raises(ToolError, match="^binds: argument --site: expected one argument$"):
        parser.parse_args(["--site"])
