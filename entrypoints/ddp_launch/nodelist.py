"""Expand a SLURM hostlist ("nid00[1-3]-hsn,login[01,05]") into host names.

Pure Python because neither scontrol nor srun exists inside the image, and a
silent fallback to localhost makes every node rendezvous with itself.
"""

from __future__ import annotations

import itertools

from ddp_launch.errors import LaunchError

# A hostlist that expands past this is a typo (a[1-1000000000]), not a job.
MAX_HOSTS = 100_000


def expand_nodelist(text: str, variable: str = "nodelist") -> tuple[str, ...]:
    """All host names of a hostlist, in SLURM's order (first = head node).

    Grammar: items separated by commas outside brackets; an item is literal text
    with any number of bracket groups ("rack[1-2]-n[01-04]-hsn"); a group is a
    comma list of numbers or ranges, zero-padded to the width of the range's
    first number, as SLURM does ([8-10] -> 8,9,10; [008-010] -> 008,009,010).
    Several groups expand as a product, the leftmost varying slowest.
    """
    hosts: list[str] = []
    for item in _split_items(text, variable):
        hosts.extend(_expand_item(item, text, variable))
        if len(hosts) > MAX_HOSTS:
            raise LaunchError(
                f"{variable}={text!r} expands to more than {MAX_HOSTS} hosts: check the ranges"
            )
    return tuple(hosts)


def _bad(text: str, variable: str, why: str) -> LaunchError:
    return LaunchError(
        f"{variable}={text!r} is not a valid SLURM hostlist ({why}); "
        f"expected a form like 'node[01-04,07],gpu-a'"
    )


def _split_items(text: str, variable: str) -> list[str]:
    items, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise _bad(text, variable, "nested '['")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _bad(text, variable, "']' without '['")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise _bad(text, variable, "'[' without ']'")
    items.append("".join(current))
    stripped = [item.strip() for item in items]
    if any(not item for item in stripped):
        raise _bad(text, variable, "empty host name")
    return stripped


def _expand_item(item: str, text: str, variable: str) -> list[str]:
    # Split into alternating parts: literal, group, literal, group, ..., literal.
    parts: list[list[str]] = []
    rest = item
    while "[" in rest:
        literal, _, after = rest.partition("[")
        group, _, rest = after.partition("]")
        parts.append([literal])
        parts.append(_expand_group(group, text, variable))
    parts.append([rest])
    if any(char.isspace() for char in item):
        raise _bad(text, variable, f"whitespace inside {item!r}")
    return ["".join(combo) for combo in itertools.product(*parts)]


def _expand_group(group: str, text: str, variable: str) -> list[str]:
    values: list[str] = []
    for term in group.split(","):
        low, dash, high = term.partition("-")
        if not _is_number(low) or (dash and not _is_number(high)):
            raise _bad(text, variable, f"bad range {term!r} in '[{group}]'")
        if not dash:
            values.append(low)
            continue
        first, last = int(low), int(high)
        if last < first:
            raise _bad(text, variable, f"range {term!r} runs backwards")
        if last - first > MAX_HOSTS:
            raise LaunchError(
                f"{variable}={text!r} expands to more than {MAX_HOSTS} hosts: check the ranges"
            )
        width = len(low)
        values.extend(str(number).zfill(width) for number in range(first, last + 1))
    return values


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()
