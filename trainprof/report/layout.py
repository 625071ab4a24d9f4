"""Lay report text out in a terminal of any width: wrapped blocks and tables that fit.

No line is ever wider than the width asked for, and nothing is cut off:

- a block (a finding's title, its evidence, its fix) wraps at spaces, its continuation lines
  indented under its text, not under its label;
- a table first takes each column's natural width; when that is too wide, headers wrap onto more
  lines, then the first column (the row's name) wraps, down to `NAME_MIN_CELLS` and as long as most
  names stay on one line; then the columns marked droppable go, least useful first, with a line
  naming them; a table that still does not fit is stacked: each row's name on its own line, its
  values as `column value` pairs below.

Widths are terminal cells (`text.cell_width`), so wide characters count twice.
"""

from __future__ import annotations

from trainprof.report._format import Table
from trainprof.report.text import cell_width, wrap

INDENT = "  "
"""Tables and stacked rows are indented this much under their title."""
GAP = 2
"""Spaces between two table columns."""
NAME_MIN_CELLS = 20
"""The first column (the row's name) wraps down to this width before columns are dropped."""
NAMES_ON_ONE_LINE_PCT = 80
"""Names wrap only while this share of them still fits on one line; else columns are dropped."""
STACKED_INDENT = "      "
"""A stacked row's values sit this far in, under its name."""


def block(label: str, text: str, width: int, indent: str = "") -> list[str]:
    """`label` then `text`, wrapped at `width`; continuation lines start under the text."""
    lead = indent + label
    return wrap(text, width, first_indent=lead, indent=" " * cell_width(lead))


def items(parts: list[str], width: int, indent: str, separator: str = "   ") -> list[str]:
    """Short facts side by side (`op aten::mm   at train.py:3   2.0 per step`), as many on a line
    as fit; a fact longer than a line wraps on its own."""
    lines: list[str] = []
    line = ""
    for part in parts:
        candidate = part if not line else line + separator + part
        if cell_width(indent + candidate) <= width:
            line = candidate
            continue
        if line:
            lines.append(indent + line)
        if cell_width(indent + part) <= width:
            line = part
        else:
            lines += wrap(part, width, first_indent=indent, indent=indent + "  ")
            line = ""
    if line:
        lines.append(indent + line)
    return lines


def table_lines(table: Table, width: int) -> list[str]:
    """`table` as lines of at most `width` cells (the module docstring's rules); the first line is
    its title."""
    lines = wrap(table.title, width, indent="  ")
    if not table.rows:
        return lines + [INDENT + "(none)"]
    columns = list(range(len(table.columns)))
    dropped: list[str] = []
    while True:
        layout = _fit(table, columns, width - len(INDENT))
        if layout is not None:
            widths, header_lines = layout
            lines += _table_body(table, columns, widths, header_lines)
            break
        droppable = [c for c in columns if table.columns[c].drop > 0]
        if not droppable:
            lines += _stacked(table, columns, width)
            break
        level = max(table.columns[c].drop for c in droppable)  # columns of one level go together
        for gone in [c for c in droppable if table.columns[c].drop == level]:
            columns.remove(gone)
            dropped.append(table.columns[gone].name)
    if dropped:
        lines += wrap(f"(left out at {width} columns: {', '.join(reversed(dropped))})", width,
                      first_indent=INDENT, indent=INDENT + " ")
    return lines


def _fit(table: Table, columns: list[int], width: int) -> tuple[list[int], int] | None:
    """Column widths and header line count that fit `width`, or None."""
    gaps = GAP * (len(columns) - 1)
    cells = [[cell_width(row[c]) for row in table.rows] for c in columns]
    headers = [table.columns[c].name for c in columns]
    natural = [max([cell_width(h), *col]) for h, col in zip(headers, cells, strict=True)]
    if sum(natural) + gaps <= width:
        return natural, 1
    # Headers on two lines: a column needs its longest header word, not the whole header.
    compact = [max([_longest_word(h), *col]) for h, col in zip(headers, cells, strict=True)]
    if sum(compact) + gaps <= width:
        return _widen_headers(compact, headers, width - gaps), 2
    # The name column wraps (while most names still fit on one line); the others keep their width.
    name_width = width - gaps - sum(compact[1:])
    typical = sorted(cells[0])[(len(cells[0]) - 1) * NAMES_ON_ONE_LINE_PCT // 100]
    if name_width >= max(NAME_MIN_CELLS, typical, _longest_word(headers[0])) or (
        len(columns) == 1 and name_width >= 1
    ):
        return [name_width, *compact[1:]], 2
    return None


def _widen_headers(widths: list[int], headers: list[str], room: int) -> list[int]:
    """Spend the room left on headers: first so that each takes at most two lines, then one."""
    widths = list(widths)
    for most_lines in (2, 1):
        for index, header in enumerate(headers):
            needed = _width_for_lines(header, most_lines)
            if needed > widths[index] and sum(widths) - widths[index] + needed <= room:
                widths[index] = needed
    return widths


def _width_for_lines(text: str, lines: int) -> int:
    """The narrowest width at which `text` wraps into at most `lines` lines."""
    width = _longest_word(text)
    while len(wrap(text, width)) > lines:
        width += 1
    return width


def _longest_word(text: str) -> int:
    return max((cell_width(word) for word in text.split()), default=0)


def _pad(text: str, width: int, right: bool) -> str:
    space = " " * max(width - cell_width(text), 0)
    return space + text if right else text + space


def _table_body(table: Table, columns: list[int], widths: list[int], header_lines: int) -> list[str]:
    numeric = [table.columns[c].numeric for c in columns]
    headers = [wrap(table.columns[c].name, w) if header_lines > 1 else [table.columns[c].name]
               for c, w in zip(columns, widths, strict=True)]
    height = max(len(h) for h in headers)
    lines = []
    for index in range(height):
        # Headers sit at the bottom of their cell, next to the values.
        cells = [h[index - (height - len(h))] if index >= height - len(h) else "" for h in headers]
        lines.append(_row_line(cells, widths, numeric))
    lines.append(INDENT + (" " * GAP).join("-" * w for w in widths))
    for row in table.rows:
        cells = [row[c] for c in columns]
        name_lines = wrap(cells[0], widths[0]) if cell_width(cells[0]) > widths[0] else [cells[0]]
        lines.append(_row_line([name_lines[0], *cells[1:]], widths, numeric))
        lines += [_row_line([more] + [""] * (len(cells) - 1), widths, numeric) for more in name_lines[1:]]
    return lines


def _row_line(cells: list[str], widths: list[int], numeric: list[bool]) -> str:
    padded = [_pad(cell, width, right) for cell, width, right in zip(cells, widths, numeric, strict=True)]
    return (INDENT + (" " * GAP).join(padded)).rstrip()


def _stacked(table: Table, columns: list[int], width: int) -> list[str]:
    lines = []
    for row in table.rows:
        lines += wrap(row[columns[0]], width, first_indent=INDENT, indent=INDENT + "  ")
        facts = [f"{table.columns[c].name} {row[c]}" for c in columns[1:]]
        lines += items(facts, width, STACKED_INDENT)
    return lines
