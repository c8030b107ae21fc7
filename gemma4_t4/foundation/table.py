"""The one table formatter: every CLI table and key/value listing goes through here, and every result
that displays itself (:class:`Displayable`: HTML in Jupyter, text elsewhere)."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from gemma4_t4.foundation.jsonable import to_jsonable


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """A plain-text table; columns listed in ``right`` are right-aligned (numbers); ``None`` is blank."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = set(right)

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def format_pairs(pairs: Sequence[tuple[str, object]]) -> str:
    """``key  value`` lines with the keys padded to one width (a one-record listing)."""
    if not pairs:
        return ""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in pairs)


def format_value(value: object) -> str:
    """One cell as text: ``-`` for nothing (or a non-finite number), yes/no, 3 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def table_cells(rows: Iterable[object],
                columns: Sequence[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """Rows (dicts, dataclasses or pydantic models) -> (columns, formatted cells)."""
    plain = [dict(_as_row(r)) for r in rows]
    if columns is None:
        columns = list(dict.fromkeys(k for row in plain for k in row))
    return list(columns), [[format_value(row.get(c)) for c in columns] for row in plain]


def _as_row(row: object) -> Mapping[str, object]:
    # a pydantic row shows its field aliases (the column names a reader sees), a dataclass its fields
    if isinstance(row, Mapping):
        return row
    dump = getattr(row, "model_dump", None)
    return dump(by_alias=True) if callable(dump) else to_jsonable(row)


def html_table(columns: Sequence[str], cells: Sequence[Sequence[str]], title: str | None = None,
               notes: Sequence[str] = ()) -> str:
    """Formatted cells as one HTML table (escaped), the title as its caption, each note a full-width
    footer row that keeps its line breaks."""
    head = "".join(f"<th style='text-align:left'>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>" for v in r) + "</tr>"
                   for r in cells)
    caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
    foot = "".join(f"<tr><td colspan='{max(len(columns), 1)}' style='text-align:left;white-space:pre-wrap'>"
                   f"{html.escape(note)}</td></tr>" for note in notes)
    foot = f"<tfoot>{foot}</tfoot>" if foot else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody>{foot}</table>"


def text_table(columns: Sequence[str], cells: Sequence[Sequence[str]], title: str | None = None,
               notes: Sequence[str] = ()) -> str:
    """Formatted cells as plain text, the title on the line above, the notes below (no columns: no table)."""
    table = [format_table([str(c) for c in columns], cells)] if columns else []
    return "\n".join([*([title] if title else []), *table, *notes])


class Displayable:
    """A result that shows itself: an HTML table in Jupyter, a text table elsewhere. A class gives
    :meth:`table_rows` and may name its ``columns``, a :meth:`caption` and :meth:`notes` (what is not
    a row: shown under the table in both displays)."""

    columns: ClassVar[Sequence[str] | None] = None  # None: every key of the rows, in order
    max_rows: ClassVar[int | None] = None  # long results show their first rows and say how many more

    def table_rows(self) -> Sequence[object]:
        raise NotImplementedError

    def caption(self) -> str | None:
        return None

    def notes(self) -> Sequence[str]:
        return ()

    def table_parts(self) -> tuple[list[str], list[list[str]], str | None, list[str]]:
        """(columns, formatted cells, title, notes): what both displays show."""
        rows = list(self.table_rows())
        title = self.caption()
        if self.max_rows is not None and len(rows) > self.max_rows:
            more = f"first {self.max_rows} of {len(rows)} rows"
            title = f"{title} ({more})" if title else more
            rows = rows[: self.max_rows]
        columns, cells = table_cells(rows, self.columns)
        return columns, cells, title, list(self.notes())

    def _repr_html_(self) -> str:
        return html_table(*self.table_parts())

    def __str__(self) -> str:
        return text_table(*self.table_parts())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's text display
        printer.text(str(self))


class Table(Displayable):
    """Rows the package assembled (results of one kind shown together, a comparison), with a title."""

    def __init__(self, rows: Iterable[object], title: str | None = None, columns: Sequence[str] | None = None):
        self._rows, self._title, self.columns = list(rows), title, columns  # type: ignore[misc]

    def table_rows(self) -> list[object]:
        return self._rows

    def caption(self) -> str | None:
        return self._title

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[object]:
        return iter(self._rows)


def pairs(values: Mapping[str, object], title: str | None = None) -> Table:
    """A one-record listing (a config's settings) as a setting/value table."""
    return Table([{"setting": k, "value": v} for k, v in values.items()], title)


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ != "TerminalInteractiveShell"


def show_table(rows: Iterable[object] | Displayable, title: str | None = None,
               columns: Sequence[str] | None = None) -> None:
    """Show rows (dicts, dataclasses, pydantic models) or a self-displaying result mid-cell: HTML in
    Jupyter, text elsewhere."""
    shown = rows if isinstance(rows, Displayable) and title is None and columns is None else Table(
        rows.table_rows() if isinstance(rows, Displayable) else rows, title, columns)
    if in_notebook():
        from IPython.display import display

        display(shown)
    else:
        print(shown)
