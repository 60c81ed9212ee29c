"""Markdown tables, as every ddp-bench report writes them."""

from __future__ import annotations

from typing import Sequence


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The header line, the separator and one line per row of a Markdown table."""
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(row) + " |" for row in rows])


def titled_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table under its title line, set apart by blank lines; "" when there are no rows."""
    if not rows:
        return ""
    return "\n".join(["", title, "", *table_lines(header, rows)]) + "\n"
