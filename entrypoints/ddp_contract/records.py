"""One reader for the objects of the JSON data files (site profiles, GPU vendors, fabric defaults): each
field declared once, with what it must be and its value when absent; each failure one line that
names the file, the key and what the value must be.

A field is checked by its rules in order; a rule answers None for a good value, else what is wrong
("must be a non-empty string"). ddp_contract.data_files has checked the file's header by then.
Hand-written, not a JSON Schema library: the job scripts read site profiles and vendor data with the
host's python3 (3.6 on SLES 15, host-modules.txt) and the standard library alone, and each message
must name the key the way the data files' READMEs do. Python 3.6 syntax.
"""

import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ddp_contract.errors import LaunchError

Rule = Callable[[Any], Optional[str]]
REQUIRED = object()  # a field without a value of its own when absent: its rules judge None
VARIABLE_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def rule(problem: str, holds: Callable[[Any], bool]) -> Rule:
    """A rule whose failure reads "'key' <problem>"."""
    return lambda value: None if holds(value) else problem


def must_be(what: str, holds: Callable[[Any], bool]) -> Rule:
    return rule("must be " + what, holds)


def showing_value(problem: str, holds: Callable[[Any], bool]) -> Rule:
    """A rule whose failure shows the wrong value too: "'key' <problem>, got 1.5"."""
    return lambda value: None if holds(value) else f"{problem}, got {value!r}"


def one_of(choices: Sequence[str], problem: str = "must be one of {choices}, got {value!r}") -> Rule:
    return lambda value: None if value in choices else problem.format(choices=", ".join(choices), value=value)


def object_of(what: str) -> Rule:
    """An object, what saying what it holds ("an object with 'limits' and 'source'")."""
    return must_be(what, lambda value: isinstance(value, dict))


def exactly(keys: Sequence[str], what: str) -> Rule:
    """An object of exactly keys, what showing its shape ('{"target": ..., "source": ...}')."""
    return must_be(what, lambda value: isinstance(value, dict) and set(value) == set(keys))


def optional(checked: Rule, suffix: str = "") -> Rule:
    """checked, for a value that may be absent (None)."""
    def check(value: Any) -> Optional[str]:
        problem = checked(value) if value is not None else None
        return problem + suffix if problem else None
    return check


def when_given(checked: Rule) -> Rule:
    """checked for a value that may be absent, its message saying so."""
    return optional(checked, " when given")


def regular_expression(value: Any) -> Optional[str]:
    try:
        re.compile(value)
    except re.error as exc:
        return f"is not a regular expression ({exc})"
    return None


def is_text(value: Any) -> bool:
    """A non-empty string."""
    return isinstance(value, str) and bool(value)


TEXT = must_be("a non-empty string", is_text)
STRING = must_be("a string", lambda value: isinstance(value, str))
FLAG = must_be("true or false", lambda value: isinstance(value, bool))
LIST = must_be("a list", lambda value: isinstance(value, list))
WORDS = must_be("a non-empty list of strings",
                lambda value: isinstance(value, list) and bool(value) and all(is_text(word) for word in value))
OBJECTS = must_be("a non-empty list of objects",
                  lambda value: isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value))
POSITIVE_INTEGER = must_be("a positive integer", lambda value: type(value) is int and value > 0)  # not true
ENV_TABLE = object_of('an object of NAME: {"value": ..., "source": ...}')


class Field(NamedTuple):
    """One key of an object: its rules, its value when absent, and what the record calls it."""

    key: str
    rules: Tuple[Rule, ...]
    default: Any = REQUIRED
    convert: Optional[Callable[[Any], Any]] = None  # the checked value as the record holds it (a tuple)
    attribute: Optional[str] = None                 # the record's name for it, where not the key
    label: Optional[str] = None                     # how messages name it, where not as its object's keys


class Reader(NamedTuple):
    """The file being read: every error names it."""

    what: str   # "site profile"
    path: str

    def error(self, text: str) -> LaunchError:
        return LaunchError(f"bad {self.what} {self.path}: {text}")

    def check(self, value: Any, rules: Iterable[Rule], label: str) -> Any:
        """value, or the error of the first rule it breaks, naming it as label."""
        for checked in rules:
            problem = checked(value)
            if problem:
                raise self.error(f"{label} {problem}")
        return value

    def value(self, data: Mapping[str, Any], field: Field, label: str = "'{}'") -> Any:
        """field's value in data (its default when absent), checked; label names a key ("'driver.{}'")."""
        value = data.get(field.key, None if field.default is REQUIRED else field.default)
        self.check(value, field.rules, field.label or label.format(field.key))
        return field.convert(value) if field.convert else value

    def record(self, data: Mapping[str, Any], fields: Sequence[Field], label: str = "'{}'") -> Dict[str, Any]:
        """Every field's value, by the record's name for it."""
        return {field.attribute or field.key: self.value(data, field, label) for field in fields}

    def known_keys(self, data: Mapping[str, Any], fields: Sequence[Field], where: str) -> None:
        """No key in data that fields do not declare (a misspelt optional key would be ignored)."""
        allowed = sorted({field.key for field in fields})
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise self.error(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")

    def env_table(self, data: Mapping[str, Any], optional_keys: Sequence[str] = (),
                  null_value: bool = False) -> List[Tuple[str, Dict[str, Any]]]:
        """An "env" object, NAME: {"value": ..., "source": ...} and the optional keys, as (NAME, entry) in
        the file's order; every value a string (or null, where null_value allows it: a site profile's
        "leave it unset") and every source a non-empty one."""
        shape = '{"value": "...", "source": "..."}' + "".join(f', with an optional "{key}"' for key in optional_keys)
        entries = []
        for name, entry in data.items():
            if not VARIABLE_NAME.match(name):
                raise self.error(f"env name {name!r} is not a valid variable name")
            if not isinstance(entry, dict) or not {"value", "source"} <= set(entry) <= {"value", "source", *optional_keys}:
                raise self.error(f"env {name} must be {shape}")
            if not (isinstance(entry["value"], str) or (null_value and entry["value"] is None)) \
                    or not is_text(entry["source"]):
                raise self.error(f"env {name}: 'value' and 'source' must be strings (source non-empty)"
                                 + ("; 'value' null leaves the variable unset" if null_value else ""))
            entries.append((name, entry))
        return entries
