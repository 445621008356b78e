"""The size limits of what the driver sends (docs/python.md#size-limits).

The database is the authority: its functions refuse (RS005) a request, result, error or
provider reference over 1 MiB, a thread state or a LangGraph checkpoint, blob or pending
write over 32 MiB, and a JSON number whose text form has more than 1,000 digits, reading the
limits from the owner-only table ``replaysafe.limits``. The driver refuses what its own
compact JSON encoding shows is over a limit before it sends anything, with
:class:`InvalidArgument` naming the argument, its size and the limit; only what comes with a
*completion* (after the side effect) is recorded instead, as an ``unknown`` action whose
error is ``{"reason": "result_too_large", "bytes": n}`` (or ``"digits": n``;
``"provider_reference_bytes": n`` for a provider reference over its limit).

A text or bytea value (a provider reference, a LangGraph blob or pending write) is measured
as the database measures it (``pg_column_size``): its bytes and the 4-byte header of a
value passed to a function, :func:`stored_size`.

A driver object checks :data:`DEFAULT_LIMITS` unless it is given ``limits=Limits(...)``:
an owner who changed the table's limits gives the driver the same values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, TypeAlias

from replaysafe_pg.errors import InvalidArgument

__all__ = ["DEFAULT_LIMITS", "GIB", "KIB", "MIB", "Limits", "Payload"]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# What a limit is for (the field of :class:`Limits`).
Payload: TypeAlias = Literal["request", "result", "error", "provider_reference",
                             "thread_state", "checkpoint", "blob", "pending_write"]

_NOUN: dict[str, str] = {
    "request": "a request", "result": "a result", "error": "an error",
    "provider_reference": "a provider reference", "thread_state": "a thread state",
    "checkpoint": "a LangGraph checkpoint", "blob": "a LangGraph channel value",
    "pending_write": "a LangGraph pending write"}

DOCS = "docs/python.md#size-limits"

# A UTF-8 character is at most 4 bytes: a text of at most limit // 4 characters (less the
# header) is within it without being measured.
_MAX_UTF8 = 4

# What pg_column_size counts of a text or bytea value besides its bytes: the varlena header
# of a value passed to a function (the database's measure of a provider reference or blob).
VALUE_HEADER = 4


@dataclass(frozen=True, slots=True)
class Limits:
    """Byte limits per payload (of its compact JSON encoding in UTF-8; for a text or bytea
    value — a provider reference, a LangGraph blob or pending write — of its bytes and the
    4-byte header the database counts) and the most digits a JSON number may have. The
    defaults are those the schema installs."""

    request: int = 1 * MIB
    result: int = 1 * MIB
    error: int = 1 * MIB
    provider_reference: int = 1 * MIB
    thread_state: int = 32 * MIB
    checkpoint: int = 32 * MIB
    blob: int = 32 * MIB
    pending_write: int = 32 * MIB
    number_digits: int = 1000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"Limits.{f.name} must be a positive int, got {value!r}")

    # --- JSON text -------------------------------------------------------------------------

    def excess(self, text: str, payload: Payload) -> dict[str, int] | None:
        """What of JSON ``text`` is over the ``payload``'s limits: ``{"bytes": n}`` (its
        UTF-8 size), ``{"digits": n}`` (its longest number), or None when it is within them."""
        limit: int = getattr(self, payload)
        n = len(text)
        # The common case: a small payload, within every limit by its length alone.
        if n <= self.number_digits and n * _MAX_UTF8 <= limit:
            return None
        data = text.encode("utf-8", "surrogatepass")
        if len(data) > limit:
            return {"bytes": len(data)}
        if n > self.number_digits:
            digits = longest_number(text, data, self.number_digits)
            if digits > self.number_digits:
                return {"digits": digits}
        return None

    def check(self, text: str, payload: Payload, what: str) -> str:
        """``text`` if it is within the ``payload``'s limits, else :class:`InvalidArgument`
        (nothing is sent)."""
        over = self.excess(text, payload)
        if over is not None:
            raise InvalidArgument(self.message(over, payload, what))
        return text

    def message(self, over: dict[str, int], payload: Payload, what: str) -> str:
        """The refusal of ``what`` for what :meth:`excess` found."""
        if "bytes" in over:
            return (f"{what} is {over['bytes']:,} bytes encoded, over the "
                    f"{getattr(self, payload):,}-byte limit of {_NOUN[payload]} ({DOCS})")
        return self.digits_message(over["digits"], what)

    def digits_message(self, digits: int, what: str) -> str:
        return (f"{what} holds a number of {digits:,} digits, over the "
                f"{self.number_digits:,}-digit limit of a JSON number ({DOCS})")

    # --- bytes and text that are not JSON --------------------------------------------------

    def check_size(self, size: int, payload: Payload, what: str) -> None:
        """:class:`InvalidArgument` when a bytea value of ``size`` bytes is over the
        ``payload``'s limit as the database measures it (:func:`stored_size`)."""
        if stored_size(size) > getattr(self, payload):
            raise InvalidArgument(self.stored_message(size, payload, what))

    def text_excess(self, value: str, payload: Payload) -> int | None:
        """The stored size (:func:`stored_size` of its UTF-8 bytes) of a text argument over
        the ``payload``'s limit, or None when it is within it."""
        limit: int = getattr(self, payload)
        if stored_size(len(value) * _MAX_UTF8) <= limit:
            return None
        size = stored_size(utf8_size(value))
        return size if size > limit else None

    def check_text(self, value: str, payload: Payload, what: str) -> str:
        """A text argument (a provider reference) within its limit, as the database measures
        it (:func:`stored_size` of its UTF-8 bytes)."""
        if self.text_excess(value, payload) is not None:
            raise InvalidArgument(self.stored_message(utf8_size(value), payload, what))
        return value

    def stored_message(self, size: int, payload: Payload, what: str) -> str:
        """The refusal of ``what``, a text or bytea value of ``size`` bytes."""
        return (f"{what} is {stored_size(size):,} bytes stored ({size:,} and a "
                f"{VALUE_HEADER}-byte header), over the {getattr(self, payload):,}-byte limit "
                f"of {_NOUN[payload]} ({DOCS})")


DEFAULT_LIMITS = Limits()


def utf8_size(text: str) -> int:
    """The UTF-8 size of ``text``; a lone surrogate counts 3 bytes (as Python escapes it)."""
    return len(text.encode("utf-8", "surrogatepass"))


def stored_size(size: int) -> int:
    """What the database measures (``pg_column_size``) of a text or bytea argument of
    ``size`` bytes: those and its 4-byte header."""
    return size + VALUE_HEADER


def limits_of(value: Any) -> Limits:
    """A driver object's ``limits=`` argument, checked."""
    if not isinstance(value, Limits):
        raise InvalidArgument(f"limits must be a replaysafe_pg.Limits, not {type(value).__name__}")
    return value


# --- numbers -----------------------------------------------------------------------------

# Every ASCII digit as b"0" (no other byte becomes one): a run of digits is a run of b"0".
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)


def longest_number(text: str, data: bytes, limit: int) -> int:
    """The digits of the longest number in JSON ``text`` (``data``: its UTF-8 bytes) if one
    has more than ``limit`` (else 0).

    The encoders of the driver write integers in full and floats in at most 17 significant
    digits and an exponent of at most 3 digits. jsonb prints a float in full: 1e308 as 309
    digits, 5e-324 as 325 (``0.``, 323 zeros, ``5``), and none has more (its last digit is
    never below 1e-324), so with a limit of at least 325 (the default is 1,000) a number
    over the limit is a run of more than ``limit`` digits. (Under a lower limit a float the
    database counts as too long may pass here; the database refuses it.) Such
    a run is looked for first (a byte translation and a search, about 2 ns a byte); only when
    one is found is the text decoded, to tell a number from a string of digits."""
    if b"0" * (limit + 1) not in data.translate(_DIGITS_AS_ZERO):
        return 0
    longest = 0

    def number(token: str) -> int:
        nonlocal longest
        longest = max(longest, token_digits(token))
        return 0

    try:
        json.loads(text, parse_int=number, parse_float=number)
    except ValueError:
        return 0  # not JSON: the encoder's problem, refused where it is decoded
    return longest if longest > limit else 0


def token_digits(token: str) -> int:
    """The digits of a JSON number token as jsonb prints it (in full, without an exponent)."""
    token = token.lstrip("-")
    if token.isdigit():
        return len(token)
    try:
        _sign, digits, exponent = Decimal(token).as_tuple()
    except InvalidOperation:
        return 0
    if not isinstance(exponent, int):
        return 0
    if exponent >= 0:
        return len(digits) + exponent
    return max(len(digits) + exponent, 1) + -exponent


def int_digits(n: int) -> int:
    """The decimal digits of ``n`` without printing it (Python refuses to print an int of
    more than ``sys.get_int_max_str_digits()`` digits)."""
    n = abs(n)
    if n < 10:
        return 1
    digits = int(n.bit_length() * 0.30102999566398120) + 1  # log10(2)
    # The estimate is the true count or one more.
    return digits - 1 if n < 10 ** (digits - 1) else digits


def longest_int(value: Any) -> int:
    """The digits of the longest int in ``value`` (dicts, their keys too, lists and tuples
    walked), for a value ``json.dumps`` refused to print."""
    longest = 0
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            longest = max(longest, int_digits(item))
        elif isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
            # json.dumps prints an int key as a string of its digits.
            stack.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)
    return longest
