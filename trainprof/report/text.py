"""Trace-derived text made safe to show: the one sanitiser every renderer uses.

A trace is input from anywhere: a kernel, op, file or thread name can hold terminal escape
sequences (an OSC window title, a clear-screen), a carriage return that rewrites a line, Unicode
bidirectional overrides that reorder what a reader sees, or megabytes of text. Every renderer
(console, report.md, `--json`, summary.json, HTML) passes such text through here:

- `safe_text(value, max_chars)` for display: one line, unsafe characters removed, line and
  paragraph breaks as spaces, combining marks at most `MAX_COMBINING_MARKS` deep on a letter (dozens
  stacked draw over the lines around them), cut to `max_chars` with a trailing `…`;
- `escape_unsafe_json(text)` for JSON, which must keep the data: the same characters written as
  `\\uXXXX` escapes, so the value decodes unchanged but no raw control byte reaches a terminal
  that shows the file;
- `cell_width` and `wrap` to lay text out in terminal columns (wide East Asian characters take two).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# Characters that break a line: shown as one space.
_BREAKS = "\t\n\v\f\r\x1c\x1d\x1e\x1f\x85\u2028\u2029"
# The character classes below are pattern sources, compiled on first use (`re` keeps them compiled):
# most text is printable ASCII and never needs them, and compiling the three costs 0.7 ms (2-core
# development machine, 2026-11-25) of every `trainprof` command's start.
# Every other C0 and C1 control (ESC and the 8-bit CSI U+009B start terminal sequences), DEL, the
# format characters (Unicode category Cf: bidirectional marks, embeddings, overrides and isolates,
# U+061C, zero-width characters, the BOM, interlinear annotation, tags) and lone surrogates (no
# UTF-8 form), and the Hangul fillers (letters that draw nothing: a name of them looks blank).
# tests/test_text.py checks this class against unicodedata's categories.
_UNSAFE = (
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\u115f\u1160\u3164\uffa0"
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]"
)
# Characters JSON may carry raw but a terminal must not see: the unsafe class less C0 (which every
# JSON encoder escapes already) and the surrogates (which no encoder writes).
_UNSAFE_IN_JSON = (
    "[\x7f-\x9f\u2028\u2029\u115f\u1160\u3164\uffa0"
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]"
)
_SURROGATES = "[\ud800-\udfff]"
# The combining blocks marks are stacked from ("Zalgo" text): diacritical marks and their extension,
# supplement, for symbols, half marks. A third one in a row and on is dropped.
_COMBINING = "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"
MAX_COMBINING_MARKS = 2
"""Combining marks kept on one letter: Vietnamese puts two on a vowel; more is decoration that
draws over neighbouring lines."""
_COMBINING_RUN = f"({_COMBINING}{{{MAX_COMBINING_MARKS}}}){_COMBINING}+"

ELLIPSIS = "…"
_WORD_BREAKS = ("/", "::", ".", "_", ",", "(", "<", "-", "=")
"""Where a word longer than a line is broken, when one of these falls in its second half."""


def _replace(match: re.Match[str]) -> str:
    return " " if match.group() in _BREAKS else ""


def safe_text(value: Any, max_chars: int | None = None) -> str:
    """`value` as one line of display text: control and format characters removed, line breaks as
    spaces, at most `max_chars` characters (a longer text ends with `…`).

    Cost is bounded by `max_chars`, not by the input: a multi-megabyte name is cut before it is
    cleaned (a prefix four times the limit is enough: cleaning only removes characters).
    """
    text = value if isinstance(value, str) else str(value)
    if max_chars is not None and len(text) > 4 * max_chars:
        return cut(_cleaned(text[: 4 * max_chars]), max_chars, always=True)
    if text.isascii() and text.isprintable():  # most names: nothing to remove (C0 and DEL fail this)
        return text if max_chars is None else cut(text, max_chars)
    text = _cleaned(text)
    return text if max_chars is None else cut(text, max_chars)


def _cleaned(text: str) -> str:
    return re.sub(_COMBINING_RUN, r"\1", re.sub(_UNSAFE, _replace, text))


def cut(text: str, max_chars: int, always: bool = False) -> str:
    """`text` cut to `max_chars` characters ending with `…` when longer (or `always`)."""
    if len(text) <= max_chars and not always:
        return text
    return text[: max(max_chars - 1, 0)] + ELLIPSIS


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes characters beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def escape_unsafe_json(encoded: str) -> str:
    """JSON text with the characters a terminal must not see written as `\\uXXXX` escapes.

    Outside strings JSON text holds no such character, so each one found is inside a string, where
    its escape decodes to the same character.
    """
    return re.sub(_UNSAFE_IN_JSON, _json_escape, encoded)


def without_surrogates(text: str) -> str:
    """`text` with lone surrogates (which have no UTF-8 form) as U+FFFD."""
    return re.sub(_SURROGATES, "\ufffd", text)


def cell_width(text: str) -> int:
    """Terminal columns `text` takes: wide and full-width characters two, combining marks none."""
    if text.isascii():
        return len(text)
    width = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def cut_cells(text: str, cells: int) -> str:
    """`text` cut to at most `cells` terminal columns, ending with `…` when cut."""
    if cell_width(text) <= cells:
        return text
    return _head(text, cells - 1) + ELLIPSIS


def _head(text: str, cells: int) -> str:
    """The longest prefix of `text` that fits `cells` columns."""
    if text.isascii():
        return text[: max(cells, 0)]
    used = 0
    for index, char in enumerate(text):
        used += cell_width(char)
        if used > cells:
            return text[:index]
    return text


def wrap(text: str, width: int, first_indent: str = "", indent: str = "") -> list[str]:
    """`text` in lines of at most `width` columns, broken at spaces; a word longer than a line is
    broken inside it (nothing is ever cut off). The first line starts with `first_indent`, the
    others with `indent` (continuation lines sit under the text, not under its label)."""
    lines: list[str] = []
    line, used = first_indent, cell_width(first_indent)
    empty = True  # nothing but the indent on the current line
    for word in text.split():
        size = cell_width(word)
        gap = 0 if empty else 1
        if used + gap + size <= width:
            line, used, empty = line + " " * gap + word, used + gap + size, False
            continue
        if not empty:
            lines.append(line)
            line, used, empty = indent, cell_width(indent), True
        room = max(width - used, 1)
        while size > room:  # a word longer than a whole line: break it, after a separator if one fits
            piece = _head(word, room) or word[0]
            breaks = [piece.rfind(mark) + len(mark) for mark in _WORD_BREAKS]
            if max(breaks) > len(piece) // 2:
                piece = piece[: max(breaks)]
            lines.append(line + piece)
            word = word[len(piece):]
            size = cell_width(word)
            line, used = indent, cell_width(indent)
            room = max(width - used, 1)
        line, used, empty = line + word, used + size, False
    lines.append(line)
    return lines
