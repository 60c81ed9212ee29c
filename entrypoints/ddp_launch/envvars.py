"""Reading settings from the environment: the first variable set, integers and ports, each with its name.

Every error names the variable (or flag), the value and the fix, so all parsing goes through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch.errors import LaunchError


@dataclass(frozen=True)
class Setting:
    """A value and where it came from ('SLURM_STEP_ID', '--rdzv-port', 'DDP_LAUNCH_RDZV_PORT'), for messages."""

    value: object
    source: str


def first_set(env: Mapping[str, str], names: tuple[str, ...]) -> Setting | None:
    """The first of names that is set to something other than blanks, stripped; None when none is."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return Setting(value, name)
    return None


def is_digits(text: str) -> bool:
    """Only 0-9: str.isdigit alone also takes '²' and other Unicode digits that int() refuses."""
    return text.isascii() and text.isdigit()


def _described(minimum: int) -> str:
    if minimum == 0:
        return "a non-negative integer"
    if minimum == 1:
        return "a positive integer"
    return f"an integer >= {minimum}"


def integer(name: str, value: object, minimum: int = 0, maximum: int | None = None,
            expected: str | None = None, fix: str = "unset it or fix its value") -> int:
    """value as a decimal integer in [minimum, maximum], or a LaunchError naming name, value and fix."""
    text = str(value).strip()
    if is_digits(text) and int(text) >= minimum and (maximum is None or int(text) <= maximum):
        return int(text)
    raise LaunchError(f"{name}={value!r} is not {expected or _described(minimum)}: {fix}")


def port(name: str, value: object) -> int:
    return integer(name, value, 1, 65535, expected="a TCP port", fix="give a number from 1 to 65535")
