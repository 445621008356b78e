"""Client-side id checks: the ASCII fast path and the general path refuse the same values."""

from __future__ import annotations

import pytest

from replaysafe_pg import _args
from replaysafe_pg.errors import InvalidArgument


class Key(str):
    """A str subclass: it takes the general path, and is accepted like a str."""


@pytest.mark.parametrize("value", [
    "k", "x" * 512, "refund:order_42:req_7", Key("k-1"),
    "é" * 512,  # 1,024 bytes: the byte limit exactly
])
def test_ids_within_the_limits_pass(value: str) -> None:
    assert _args.text_id(value, "action_key") == value


@pytest.mark.parametrize(("value", "message"), [
    ("", "must not be empty"),
    ("x" * 513, "at most 512 characters"),
    ("a\x00b", "NUL"),
    ("€" * 342, "at most 1024 bytes"),  # 342 characters, 1,026 bytes
    ("\ud800", "lone surrogate"),
    (b"k", "must be a str"),
    (7, "must be a str"),
    (Key(""), "must not be empty"),
])
def test_ids_outside_the_limits_are_refused(value: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _args.text_id(value, "action_key")
