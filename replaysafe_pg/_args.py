"""Client-side checks of argument types and ranges, before anything is sent.

The SQL functions are the authority (they raise RS005 for the same values); these checks
exist so that a wrong type fails as :class:`InvalidArgument` with a clear message instead of
going out as ``bytea`` or ``integer`` (no function of that signature: a misleading
``SchemaNotInstalled``) or failing inside Python (``timedelta(seconds=inf)``).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from replaysafe_pg.errors import InvalidArgument

# docs/sql-ledger.md: every id is non-empty text of at most 512 characters and 1,024 bytes in UTF-8.
MAX_ID_CHARS = 512
MAX_ID_BYTES = 1024
MAX_LEASE = timedelta(days=7)


def utf8_size(value: str, what: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid text (it holds a lone surrogate)") from None


def text(value: Any, what: str) -> str:
    """Any text the database can store (no NUL, encodable)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters")
    utf8_size(value, what)
    return value


def optional_text(value: Any, what: str) -> str | None:
    return None if value is None else text(value, what)


def text_id(value: Any, what: str) -> str:
    """An id: tenant, action key, thread, user, worker, operation."""
    # The common case in one test: ASCII (one byte a character, so at most 512 bytes).
    if type(value) is str and 0 < len(value) <= MAX_ID_CHARS and value.isascii() \
            and "\x00" not in value:
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidArgument(f"{what} must be at most {MAX_ID_CHARS} characters, "
                              f"got {len(value)}")
    text(value, what)
    if (size := utf8_size(value, what)) > MAX_ID_BYTES:
        raise InvalidArgument(f"{what} must be at most {MAX_ID_BYTES} bytes in UTF-8, got {size}")
    return value


def secret(value: Any, what: str) -> str:
    """A claim token or an attempt token: a str of 1 to 512 characters (a claim token's
    minimum length is the database's to enforce). Never echoed in an error."""
    if type(value) is str and 0 < len(value) <= MAX_ID_CHARS and value.isascii():
        return value
    if type(value) is not str or not 0 < len(value) <= MAX_ID_CHARS:
        raise InvalidArgument(f"{what} must be a non-empty str of at most {MAX_ID_CHARS} "
                              f"characters (got {type(value).__name__}"
                              f"{f' of {len(value)} characters' if isinstance(value, str) else ''})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} must be valid text (it holds a lone surrogate)") from None
    return value


def optional_id(value: Any, what: str) -> str | None:
    return None if value is None else text_id(value, what)


def integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an int, not {type(value).__name__}")
    return value


def flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be a bool, not {type(value).__name__}")
    return value


def moment(value: Any, what: str = "now") -> datetime | None:
    """``now``: None (the database clock at the call) or a timezone-aware datetime."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(f"{what} must be None or a timezone-aware datetime")
    return value


def seconds(value: Any, what: str) -> float:
    """A finite number of seconds (int or float, not bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidArgument(f"{what} must be finite, got {value}")
    return float(value)


def duration(value: Any, what: str) -> timedelta:
    """A timedelta, or a finite number of seconds that fits one."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a timedelta or a number of seconds, "
                              f"not {type(value).__name__}")
    number = seconds(value, what)
    try:
        return timedelta(seconds=number)
    except OverflowError:
        raise InvalidArgument(f"{what} is out of range: {value} seconds") from None


def lease(value: Any, what: str = "lease") -> timedelta:
    """Positive, finite, at most 7 days (docs/sql-ledger.md)."""
    interval = duration(value, what)
    if interval <= timedelta(0):
        raise InvalidArgument(f"{what} must be positive, got {interval}")
    if interval > MAX_LEASE:
        raise InvalidArgument(f"{what} must be at most 7 days, got {interval}")
    return interval


def age(value: Any, what: str) -> timedelta:
    """Zero or more, finite (``older_than``)."""
    interval = duration(value, what)
    if interval < timedelta(0):
        raise InvalidArgument(f"{what} must not be negative, got {interval}")
    return interval
