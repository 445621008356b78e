"""replaysafe_pg.limits: what counts as over a limit (no database)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replaysafe_pg import DEFAULT_LIMITS, InvalidArgument, Limits
from replaysafe_pg.limits import MIB, int_digits, longest_int, longest_number, token_digits


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_the_defaults_are_the_schemas() -> None:
    d = DEFAULT_LIMITS
    assert (d.request, d.result, d.error, d.provider_reference) == (MIB,) * 4
    assert (d.thread_state, d.checkpoint, d.blob, d.pending_write) == (32 * MIB,) * 4
    assert d.number_digits == 1000
    with pytest.raises(AttributeError):
        d.request = 1  # type: ignore[misc]


@pytest.mark.parametrize("char, width", [("x", 1), ("é", 2), ("€", 3), ("😀", 4)])
def test_bytes_are_counted_in_utf8_up_to_and_over_the_limit(char: str, width: int) -> None:
    limits = Limits(request=1200)
    within = compact({"s": char * ((1200 - 8) // width)})
    assert limits.excess(within, "request") is None
    over = compact({"s": char * ((1200 - 8) // width + 1)})
    assert limits.excess(over, "request") == {"bytes": len(over.encode())}


def test_digits_count_numbers_only_never_strings() -> None:
    limits = Limits(number_digits=10)
    assert limits.excess(compact({"n": 10 ** 9, "pad": "x" * 50}), "request") is None
    assert limits.excess(compact({"n": 10 ** 10, "pad": "x" * 50}), "request") == {"digits": 11}
    assert limits.excess(compact({"s": "1" * 50}), "request") is None
    assert limits.excess(compact(["\\\"", "1" * 40, -(10 ** 30)]), "request") == {"digits": 31}
    assert limits.excess(compact({"f": 1.5e300, "pad": "x" * 50}), "request") is None


def test_the_bytes_are_reported_before_the_digits() -> None:
    limits = Limits(request=100, number_digits=10)
    assert limits.excess(compact([10 ** 200]), "request") == {"bytes": 203}


def test_token_digits_as_jsonb_prints_them() -> None:
    assert token_digits("-12345") == 5
    assert token_digits("1e3") == 4            # 1000
    assert token_digits("1.5e-3") == 5         # 0.0015
    assert token_digits("123.45") == 5
    assert token_digits("-0.5") == 2


def test_a_float_has_at_most_325_digits_as_jsonb_prints_it() -> None:
    # The smallest floats print furthest from the point: 5e-324 is 0., 323 zeros and 5.
    assert token_digits(repr(5e-324)) == 325
    assert token_digits(repr(2.2250738585072014e-308)) == 325
    assert token_digits(repr(1.7976931348623157e308)) == 309
    assert Limits(number_digits=325).excess(compact([5e-324, -1e308]), "request") is None


@given(st.integers(min_value=-(10 ** 400), max_value=10 ** 400))
def test_int_digits_is_exact(n: int) -> None:
    assert int_digits(n) == len(str(abs(n)))


@pytest.mark.parametrize("n", [9, 10, 99, 100, 10 ** 999 - 1, 10 ** 999, 10 ** 1000 - 1])
def test_int_digits_at_powers_of_ten(n: int) -> None:
    assert int_digits(n) == len(str(n))


def test_longest_int_walks_keys_values_and_lists_without_printing() -> None:
    assert longest_int({"a": [1, (22, {"b": 10 ** 5000})], 10 ** 10: True}) == 5001
    assert longest_int({"a": True, "b": 1.5, "c": "123456"}) == 0
    cyclic: list[object] = [10 ** 20]
    cyclic.append(cyclic)
    assert longest_int(cyclic) == 21


def test_longest_number_looks_only_when_a_long_run_of_digits_is_there() -> None:
    def longest(text: str, limit: int) -> int:
        return longest_number(text, text.encode(), limit)

    assert longest(compact({"n": 10 ** 20}), 30) == 0
    assert longest(compact({"n": 10 ** 40}), 30) == 41
    assert longest(compact({"n": 10 ** 40, "s": "1" * 80}), 30) == 41
    assert longest(compact({"n": 10 ** 20, "s": "1" * 80}), 30) == 0
    assert longest('{"broken": 1' + "1" * 40, 30) == 0  # not JSON: not ours to judge


def test_messages_name_the_argument_its_size_and_the_limit() -> None:
    limits = Limits(thread_state=10, number_digits=3)
    with pytest.raises(InvalidArgument) as info:
        limits.check(compact({"s": "xxxxxxxx"}), "thread_state", "state")
    assert str(info.value) == ("state is 16 bytes encoded, over the 10-byte limit of a thread "
                               "state (docs/python.md#size-limits)")
    with pytest.raises(InvalidArgument, match="request holds a number of 4 digits, over the "
                       "3-digit limit of a JSON number"):
        Limits(number_digits=3).check("[1000]", "request", "request")
    with pytest.raises(InvalidArgument) as info:
        Limits(provider_reference=8).check_text("ééx", "provider_reference",
                                                "provider_reference")
    assert str(info.value) == ("provider_reference is 9 bytes stored (5 and a 4-byte header), "
                               "over the 8-byte limit of a provider reference "
                               "(docs/python.md#size-limits)")
    with pytest.raises(InvalidArgument, match=r"the write is 7 bytes stored \(3 and a 4-byte "
                       r"header\), over the 6-byte limit of a LangGraph pending write"):
        Limits(pending_write=6).check_size(3, "pending_write", "the write")


@pytest.mark.parametrize("char", ["x", "é", "€", "😀"])
def test_a_text_is_measured_as_stored_its_utf8_bytes_and_a_4_byte_header(char: str) -> None:
    # pg_column_size of a text argument: its bytes and the 4-byte varlena header.
    width = len(char.encode())
    limits = Limits(provider_reference=4 + 12 * width)
    at_limit, over = char * 12, char * 12 + "x"
    assert limits.text_excess(at_limit, "provider_reference") is None
    assert limits.check_text(at_limit, "provider_reference", "ref") == at_limit
    assert limits.text_excess(over, "provider_reference") == 4 + 12 * width + 1
    with pytest.raises(InvalidArgument, match=f"ref is {4 + 12 * width + 1} bytes stored"):
        limits.check_text(over, "provider_reference", "ref")


def test_a_long_text_of_one_byte_characters_is_within_a_large_limit() -> None:
    text = "r" * (MIB - 4)
    assert DEFAULT_LIMITS.text_excess(text, "provider_reference") is None
    assert DEFAULT_LIMITS.text_excess(text + "r", "provider_reference") == MIB + 1


def test_bytes_are_measured_as_stored_with_the_header() -> None:
    limits = Limits(blob=1000, pending_write=1000)
    limits.check_size(996, "blob", "the value")
    limits.check_size(996, "pending_write", "the write")
    with pytest.raises(InvalidArgument, match=r"is 1,001 bytes stored \(997 and a 4-byte"):
        limits.check_size(997, "blob", "the value")
