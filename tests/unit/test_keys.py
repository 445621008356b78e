"""keys.tool_call_key: stable, unambiguous, within the id bounds."""

from __future__ import annotations

import pytest

from replaysafe_pg import (
    InvalidArgument,
    keys,
)


def test_tool_call_key_is_stable_and_unambiguous() -> None:
    k = keys.tool_call_key("thread-1", "msg-2", "call_3")
    assert k == keys.tool_call_key("thread-1", "msg-2", "call_3")
    assert keys.tool_call_key("a:b", "c", "d") != keys.tool_call_key("a", "b:c", "d")
    assert keys.tool_call_key("a.1", "b", "c") != keys.tool_call_key("a", "1.b", "c")
    long = keys.tool_call_key("t" * 300, "m" * 300, "c")
    assert len(long) <= 512 and long == keys.tool_call_key("t" * 300, "m" * 300, "c")
    assert long != keys.tool_call_key("t" * 300, "m" * 300, "d")
    with pytest.raises(InvalidArgument, match="message_id"):
        keys.tool_call_key("t", "", "c")


def test_tool_call_key_stays_within_512_characters_and_1024_bytes() -> None:
    """The id limits (docs/sql-ledger.md) both: 400 CJK characters are 1,200 bytes in UTF-8."""
    cases = [("\u4e2d" * 400, "m", "c"), ("\u4e2d" * 170, "\u6587" * 170, "c"),
             ("\U0001f980" * 300, "m", "c"), ("t" * 300, "m" * 300, "c"), ("t", "m", "\u00e9" * 500)]
    for parts in cases:
        key = keys.tool_call_key(*parts)
        assert len(key) <= 512 and len(key.encode("utf-8")) <= 1024, parts
        assert key == keys.tool_call_key(*parts)
        assert key != keys.tool_call_key(*parts[:2], parts[2] + "x")
    # Within both limits the key stays readable.
    plain = keys.tool_call_key("\u00e9" * 100, "m", "c")
    assert plain.startswith("tc:") and "\u00e9" * 100 in plain


def test_tool_call_key_rejects_parts_that_are_not_text() -> None:
    for bad in (b"t", 42, None, "a\u0000b", "a\ud800b"):
        with pytest.raises(InvalidArgument, match="thread_id"):
            keys.tool_call_key(bad, "m", "c")  # type: ignore[arg-type]
