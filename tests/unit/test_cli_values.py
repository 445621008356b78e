"""Values of the command line: durations in, escaped text out."""

from __future__ import annotations

from datetime import timedelta

import pytest

from replaysafe_pg.cli import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 7 * 86400), ("2h", 7200), ("30m", 1800), ("90s", 90), ("1d12h", 129600), ("2w", 1209600),
    ("1.5h", 5400)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "7", "d", "7 parsecs", "-1d", "1d garbage"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_escape_keeps_ordinary_unicode() -> None:
    from replaysafe_pg.cli.render import escape

    assert escape("Grüße, 中文, 🦀 e\u0301") == "Grüße, 中文, 🦀 e\u0301"
    assert escape("a\x1bb\x00\t\r\n\x7f\x85\x9b\u202e\u2028") == \
        "a\\x1bb\\x00\\t\\r\\n\\x7f\\x85\\x9b\\u202e\\u2028"
    assert escape("two\nlines", keep_newlines=True) == "two\nlines"
