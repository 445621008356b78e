"""How the command line shows values: aligned tables for people, JSON for machines.

Values come from the database, where an agent may have written anything: every character
that a terminal acts on (C0 and C1 controls, DEL) or that reorders what is shown (bidi
controls, line and paragraph separators) is printed as a visible escape (``\\x1b``,
``\\u202e``) by :func:`escape`, so a key cannot recolour, clear or rewrite the operator's
screen. ``--json`` keeps values exact, with the same characters as JSON ``\\u`` escapes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

_CELL_WIDTH = 48

_BIDI_AND_SEPARATORS = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")
# What json.dumps(ensure_ascii=False) leaves raw; such characters only occur inside strings.
_UNSAFE_IN_JSON = re.compile(f"[\x7f-\x9f{_BIDI_AND_SEPARATORS}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` safe for a terminal: control characters as ``\\x1b``-style escapes, ordinary
    Unicode unchanged. ``keep_newlines`` for whole outputs whose line breaks are ours."""
    return (_UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE).sub(_visible, text)


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as ISO 8601 text and intervals as seconds."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def dumps(value: Any, *, line: bool = False) -> str:
    """JSON for stdout; ``line`` for one compact line (JSON Lines, one document per event)."""
    text = (json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False) if line
            else json.dumps(jsonable(value), indent=2, ensure_ascii=False))
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def duration(value: timedelta) -> str:
    """A short human duration: ``3d 4h``, ``12m 5s``, ``-2s``."""
    seconds = int(value.total_seconds())
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
        if len(parts) == 2:
            break
    return sign + " ".join(parts)


def cell(value: Any, width: int = _CELL_WIDTH) -> str:
    if value is None:
        return "-"
    if isinstance(value, enum.Enum):
        text = str(value.value)
    elif isinstance(value, datetime):
        text = value.isoformat(sep=" ", timespec="seconds")
    elif isinstance(value, timedelta):
        text = duration(value)
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, dict | list):
        text = json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False)
    else:
        text = str(value)
    text = escape(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *,
          cut_at: Mapping[str, int] | None = None) -> str:
    """An aligned text table of ``columns`` (a header line, then one line per row); a cell is
    cut at 48 characters, or at ``cut_at[column]``."""
    limits = [(cut_at or {}).get(c, _CELL_WIDTH) for c in columns]
    cells = [[cell(row.get(c), w) for c, w in zip(columns, limits, strict=True)] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``name: value`` lines, names aligned, for one record."""
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name.ljust(width)}  {cell(value, 200)}" for name, value in pairs)
