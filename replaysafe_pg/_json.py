"""Strict JSON for what we store: no NaN/Infinity, nothing Postgres' jsonb would refuse."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from replaysafe_pg.errors import InvalidArgument
from replaysafe_pg.limits import DEFAULT_LIMITS, Limits, Payload, longest_int

# "\u0000" in JSON text, unless the backslash itself is escaped ("\\u0000" is fine).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class TooLong(InvalidArgument):
    """A value over its size limit (``.over``: what :meth:`Limits.excess` found)."""

    def __init__(self, message: str, over: dict[str, int]) -> None:
        super().__init__(message)
        self.over = over


def encode(value: Any, what: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """``value`` as compact JSON text, or :class:`InvalidArgument` (an int too long for
    Python to print: :class:`TooLong`)."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
            digits = longest_int(value)
            raise TooLong(limits.digits_message(digits, what), {"digits": digits}) from None
        raise InvalidArgument(f"{what} is not JSON-serialisable: {exc}") from None


def dumps(value: Any, what: str, payload: Payload | None = None,
          limits: Limits = DEFAULT_LIMITS) -> str:
    """``value`` as JSON text for a jsonb parameter, or :class:`InvalidArgument`; with
    ``payload``, also when it is over that payload's ``limits`` (:class:`TooLong`)."""
    text = encode(value, what, limits)
    if has_nul(text):
        raise InvalidArgument(f"{what} contains a NUL character (\\u0000), which jsonb cannot store")
    if payload is not None:
        over = limits.excess(text, payload)
        if over is not None:
            raise TooLong(limits.message(over, payload, what), over)
    return text


def dumps_object(value: Any, what: str, payload: Payload | None = None,
                 limits: Limits = DEFAULT_LIMITS) -> str:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    return dumps(value, what, payload, limits)


def has_nul(text: str) -> bool:
    """Does JSON ``text`` hold an escaped NUL character (which jsonb refuses)?"""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None


def _number(token: str) -> float | int:
    # jsonb keeps numbers as numeric and prints them without an exponent: "1e+23" is read
    # back as 100000000000000000000000, an int (and unequal to the float 1e23).
    if "e" in token or "E" in token:
        exact = Decimal(token)
        exponent = exact.as_tuple().exponent
        if isinstance(exponent, int) and exponent >= 0:
            return int(exact)
    return float(token)


def _constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number (JSON has no NaN or Infinity)")


def loads(text: str | bytes) -> Any:
    """What reading ``text`` back from a jsonb column gives: the value a replay returns.
    ``ValueError`` for NaN and Infinity (JSON has no such numbers, jsonb refuses them)."""
    return json.loads(text, parse_float=_number, parse_constant=_constant)


_to_json: Callable[..., bytes] | None = None


def pydantic_json(value: Any) -> bytes:
    """The default encoding of results: pydantic-core's ``to_json`` (docs/run.md); NaN and
    Infinity are written as such, for :func:`loads` to refuse."""
    global _to_json
    if _to_json is None:
        # Imported on first use: a worker starts without it, it is needed only to record a
        # result.
        from pydantic_core import to_json

        _to_json = to_json
    return _to_json(value, inf_nan_mode="constants")
