"""Tables for the terminal: readable at 80 columns, ids never cut, plain when piped."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from .app import console


def _when(value: object) -> str:
    return "" if value is None else str(value)[:19]


def _cell(value: object) -> Text:
    """A table cell shown as it is (never read as Rich markup)."""
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


def new_table(*columns: str, title: str | None = None, keys: tuple[str, ...] = ()) -> Table:
    """A table whose long cells wrap, a word longer than its column folding onto the next
    line rather than being cut. The `keys` columns (ids, refs, keys) do not wrap: they keep
    their width while any other column can give way, and even then fold rather than end in
    an ellipsis. Piped or redirected, the table has no box-drawing characters."""
    plain = not console.is_terminal
    table = Table(
        title=title,
        box=None if plain else box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
        pad_edge=False,
        collapse_padding=not plain,
    )
    for name in columns:
        if name in keys:
            table.add_column(name, no_wrap=True, overflow="fold")
        else:
            table.add_column(name, overflow="fold")
    return table


def _narrowest(name: str, cells: tuple[Text, ...], key: bool) -> int:
    """The narrowest a column can be without splitting a word (for a key, a line)."""
    texts = [name, *(c.plain for c in cells)]
    parts = [line for t in texts for line in t.splitlines()] if key else " ".join(texts).split()
    return max((len(p) for p in parts), default=1)


def records_table(
    columns: tuple[str, ...],
    rows: Sequence[tuple[object, ...]],
    *,
    title: str | None = None,
    keys: tuple[str, ...] = (),
) -> Table:
    """Records one row each while that fits the console without splitting a word;
    otherwise one record after the other, a field per line (like psql's expanded mode),
    so 80 columns stay readable."""
    cells = [tuple(_cell(v) for v in row) for row in rows]
    by_column = [tuple(row[i] for row in cells) for i in range(len(columns))]
    needed = sum(
        _narrowest(name, column, name in keys)
        for name, column in zip(columns, by_column, strict=True)
    )
    if needed + 2 * (len(columns) - 1) <= console.width:
        table = new_table(*columns, title=title, keys=keys)
        for row in cells:
            table.add_row(*row)
        return table
    table = new_table("field", "value", title=title)
    table.show_header = False
    for i, row in enumerate(cells):
        if i:
            table.add_row("", "")
        for name, value in zip(columns, row, strict=True):
            table.add_row(Text(name, style="bold"), value)
    return table
