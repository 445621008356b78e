"""Strict JSON for what we store: no NaN/Infinity, nothing Postgres' jsonb would refuse."""

from __future__ import annotations

import json
import re
from typing import Any

from replaysafe_pg.errors import InvalidArgument

# "\u0000" in JSON text, unless the backslash itself is escaped ("\\u0000" is fine).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dumps(value: Any, what: str) -> str:
    """``value`` as JSON text for a jsonb parameter, or :class:`InvalidArgument`."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} is not JSON-serialisable: {exc}") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidArgument(f"{what} contains a NUL character (\\u0000), which jsonb cannot store")
    return text


def dumps_object(value: Any, what: str) -> str:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    return dumps(value, what)
