"""Formatting shared by the report's HTML parts: numbers with units, ✓/✗, — for a missing
value, escaped text (bidi controls made visible) and cells with the raw value the sorting
script compares."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

DASH = "—"


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def number(value: float | None, unit: str = "", digits: int | None = None) -> str:
    """A number with its unit, to a precision that fits its size; — when there is none."""
    if missing(value):
        return DASH
    value = float(value)
    if digits is None:
        size = abs(value)
        digits = 0 if size >= 100 else 1 if size >= 10 else 2 if size >= 0.01 or size == 0 else 4
    text = f"{value:,.{digits}f}"
    if text.startswith("-") and not text.strip("-0.,"):
        text = text[1:]  # -0.0001 shown to 3 digits is 0.000, not -0.000
    return f"{text} {unit}" if unit else text


def check(passed: bool) -> str:
    return "✓" if passed else "✗"


# Characters that reorder the text around them (bidi embeddings, overrides, isolates, marks):
# shown as ⟨U+202E⟩ and so on, so model output cannot rearrange what a reviewer reads.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_SHOWN_BIDI = {ord(char): f"⟨U+{ord(char):04X}⟩" for char in BIDI_CONTROLS}


def esc(value: object) -> str:
    """Text for the page, in an element or an attribute: HTML-escaped, bidi controls shown."""
    text = DASH if missing(value) else str(value)
    return html.escape(text, quote=True).translate(_SHOWN_BIDI)


_TEXT = object()  # a cell sorted by its own text


def cell(text: object, sort: object = _TEXT, cls: str = "", raw: bool = False) -> str:
    """A table cell; `sort` is the raw value the sorting script compares (blank sorts last)."""
    attrs = "" if sort is _TEXT else f' data-sort="{"" if missing(sort) else esc(sort)}"'
    attrs += f' class="{cls}"' if cls else ""
    return f"<td{attrs}>{text if raw else esc(text)}</td>"


def table(headers: Sequence[str], rows: Sequence[str], cls: str = "sortable") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(f"<tr>{row}</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
