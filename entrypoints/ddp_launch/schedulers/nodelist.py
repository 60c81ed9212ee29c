"""Expand a SLURM hostlist ("nid00[1-3]-hsn,login[01,05]") into host names.

Pure Python because neither scontrol nor srun exists inside the image, and a
silent fallback to localhost makes every node rendezvous with itself.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from ddp_launch.envvars import is_digits
from ddp_launch.errors import LaunchError

# SLURM's own hostlist code takes a larger range for an error (MAX_RANGE, 64K
# hosts, SchedMD/slurm src/common/hostlist.c): no job of SLURM's has more, so a
# hostlist that would expand past it (a[1-1000000000], n[1-10000]x[1-10000]) is
# a typo, refused from its counted size before a single name is built.
MAX_HOSTS = 64 * 1024


def expand_nodelist(text: str, variable: str = "nodelist") -> tuple[str, ...]:
    """All host names of a hostlist, in SLURM's order (first = head node).

    Grammar: items separated by commas outside brackets; an item is literal text
    with any number of bracket groups ("rack[1-2]-n[01-04]-hsn"); a group is a
    comma list of numbers or ranges, zero-padded to the width of the range's
    first number, as SLURM does ([8-10] -> 8,9,10; [008-010] -> 008,009,010).
    Several groups expand as a product in SLURM's order: the last group varies
    fastest, then the first, the second, ..., the one before the last slowest.
    """
    items = [_parse_item(item, text, variable) for item in _split_items(text, variable)]
    count = sum(_host_count(parts) for parts in items)
    if count > MAX_HOSTS:
        raise LaunchError(f"{variable}={text!r} names {count} hosts, more than SLURM's limit of "
                          f"{MAX_HOSTS} for one hostlist: check the ranges")
    return tuple(host for parts in items for host in _expand(parts))


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


# A bracket group as its terms (first, last, zero-padded width); "7" is (7, 7, 1).
Group = list[tuple[int, int, int]]


def _parse_item(item: str, text: str, variable: str) -> list[str | Group]:
    """An item as alternating parts, literal, group, literal, ..., literal; groups unexpanded."""
    if any(char.isspace() for char in item):
        raise _bad(text, variable, f"whitespace inside {item!r}")
    parts: list[str | Group] = []
    rest = item
    while "[" in rest:
        literal, _, after = rest.partition("[")
        group, _, rest = after.partition("]")
        parts += [literal, _parse_group(group, text, variable)]
    parts.append(rest)
    return parts


def _host_count(parts: list[str | Group]) -> int:
    return math.prod(sum(last - first + 1 for first, last, _ in part)
                     for part in parts if not isinstance(part, str))


def _expand(parts: list[str | Group]) -> Iterator[str]:
    choices = [[part] if isinstance(part, str) else
               [str(number).zfill(width) for first, last, width in part for number in range(first, last + 1)]
               for part in parts]
    groups = [index for index, part in enumerate(parts) if not isinstance(part, str)]
    # SLURM splits an item at its last '[' and pushes that group's range for each
    # prefix; the prefix expands from its own last group inward, recursing to the
    # first (_push_range_list in SchedMD/slurm src/common/hostlist.c). So the last
    # group varies fastest, then the first, then the second, ...: a[1-2]b[1-2][1-2]
    # is a1b11 a1b12 a2b11 a2b12 a1b21 ..., as `scontrol show hostnames` prints.
    slowest_first = groups[-2::-1] + groups[-1:]
    for values in itertools.product(*(choices[index] for index in slowest_first)):
        name = [part if isinstance(part, str) else "" for part in parts]
        for index, value in zip(slowest_first, values):
            name[index] = value
        yield "".join(name)


def _parse_group(group: str, text: str, variable: str) -> Group:
    terms: Group = []
    for term in group.split(","):
        low, dash, high = term.partition("-")
        if not is_digits(low) or (dash and not is_digits(high)):
            raise _bad(text, variable, f"bad range {term!r} in '[{group}]'")
        first, last = int(low), int(high if dash else low)
        if last < first:
            raise _bad(text, variable, f"range {term!r} runs backwards")
        # The range's first number sets the width, as SLURM does ([8-10], [008-010]).
        terms.append((first, last, len(low)))
    return terms
