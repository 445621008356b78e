"""What ``run`` returns and stores as a result: the first call gives what every replay gives
(the JSON round trip through jsonb), everyday Python values are encoded, ``args`` stay
strict, and a result that cannot be stored leaves its repr in the action's error."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import random
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pydantic
import pytest
from pydantic_core import to_jsonable_python

from replaysafe_pg import AsyncLedger, Call, InvalidArgument, Ledger, UnstorableResult


def count_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM replaysafe.actions").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def led(dsn: str) -> Iterator[Ledger]:
    with Ledger(dsn, tenant_id="t1", worker_id="w1") as ledger:
        yield ledger


def returns(value: Any) -> Callable[[], Any]:
    calls: list[None] = []

    def tool() -> Any:
        calls.append(None)
        assert len(calls) == 1, "the tool ran twice"
        return value

    return tool


# --- the first call returns what a replay returns -------------------------------------------

# int and None keys become strings, tuples arrays; a float written with an exponent that has
# no fraction digits comes back from jsonb (numeric) as an int.
ODD = {1: "a", "z": (1, 2), "nested": {"t": ((1, 2), [3, (4,)]), 2: {None: 0.5}},
       "huge": 1e23, "tiny": 1.5e-07, "exact": 1e16, "neg": -2.5e300}
ODD_JSON = {"1": "a", "z": [1, 2], "nested": {"t": [[1, 2], [3, [4]]], "2": {"None": 0.5}},
            "huge": 10**23, "tiny": 1.5e-07, "exact": 10**16, "neg": -25 * 10**299}


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same JSON types all the way down (1 == 1.0 would hide a change)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def test_the_first_call_returns_what_a_replay_returns(led: Ledger) -> None:
    first = led.run("t", returns(ODD), {}, key="k")
    replay = led.run("t", returns(ODD), {}, key="k")
    stored = led.get("k")
    assert stored is not None and (first.replay, replay.replay) == (False, True)
    assert first.result == replay.result == stored.result == ODD_JSON
    assert same(first.result, replay.result) and same(first.result, ODD_JSON)


def test_floats_of_every_magnitude_come_back_as_jsonb_gives_them(led: Ledger) -> None:
    rng = random.Random(10)
    floats = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1e15,
              1e16, 123456789012345678.0, 1e22, 1e23, 9007199254740993.0]
    floats += [rng.uniform(1, 10) * 10.0 ** rng.randint(-320, 300) * rng.choice((1, -1))
               for _ in range(500)]
    first = led.run("t", returns(floats), {}, key="k")
    replay = led.run("t", returns(floats), {}, key="k")
    assert same(first.result, replay.result)


def test_the_first_call_returns_what_a_replay_returns_async(dsn: str) -> None:
    async def tool() -> Any:
        return ODD

    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1") as led:
            first = await led.run("t", tool, {}, key="k")
            replay = await led.run("t", tool, {}, key="k")
            assert (first.replay, replay.replay) == (False, True)
            assert same(first.result, replay.result) and same(first.result, ODD_JSON)
            many = await led.run_many([Call("t", tool, {}, "m1"), Call("t", tool, {}, "m2")])
            again = await led.run_many([Call("t", tool, {}, "m1"), Call("t", tool, {}, "m2")])
            assert all(same(e.result, ODD_JSON) and same(e.result, r.result)
                       for e, r in zip(many, again, strict=True))

    asyncio.run(main())


def test_run_many_returns_what_a_replay_returns(led: Ledger) -> None:
    calls = [Call("t", returns(ODD), {}, "a"), Call("t", returns((1, 2)), {}, "b")]
    first = led.run_many(calls)
    again = led.run_many([Call("t", lambda: None, {}, "a"), Call("t", lambda: None, {}, "b")])
    assert [e.replay for e in first + again] == [False, False, True, True]
    assert same(first[0].result, ODD_JSON) and same(first[1].result, [1, 2])
    assert all(same(f.result, a.result) for f, a in zip(first, again, strict=True))


# --- everyday values ---------------------------------------------------------------------

class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Refund:
    refund_id: str
    amount: Decimal
    at: datetime


class Charge(pydantic.BaseModel):
    charge_id: str = pydantic.Field(alias="id")
    amount: Decimal
    created: datetime


AT = datetime(2026, 11, 30, 15, 4, 5, 123456, tzinfo=UTC)
EVERYDAY = {
    "aware": AT,
    "offset": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
    "naive": datetime(2026, 1, 2, 3, 4, 5),
    "date": date(2026, 1, 2),
    "duration": timedelta(minutes=1, seconds=30.5),
    "decimal": Decimal("12.50"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "enum": Color.RED,
    "int_enum": Level.HIGH,
    "dataclass": Refund("re_1", Decimal("5.00"), AT),
    "model": Charge(id="ch_1", amount=Decimal("7"), created=AT),
    "set": {3},
    "frozenset": frozenset({"x"}),
    "bytes": b"raw",
    "path": Path("/tmp/receipt.pdf"),
    "keys": {Color.RED: 1, 2: 2, uuid.UUID(int=1): 3},
}
EVERYDAY_JSON = {
    "aware": "2026-11-30T15:04:05.123456Z",
    "offset": "2026-01-02T03:04:05+02:00",
    "naive": "2026-01-02T03:04:05",
    "date": "2026-01-02",
    "duration": "PT1M30.5S",
    "decimal": "12.50",
    "uuid": "12345678-1234-5678-1234-567812345678",
    "enum": "red",
    "int_enum": 3,
    "dataclass": {"refund_id": "re_1", "amount": "5.00", "at": "2026-11-30T15:04:05.123456Z"},
    "model": {"id": "ch_1", "amount": "7", "created": "2026-11-30T15:04:05.123456Z"},
    "set": [3],
    "frozenset": ["x"],
    "bytes": "raw",
    "path": "/tmp/receipt.pdf",
    "keys": {"red": 1, "2": 2, "00000000-0000-0000-0000-000000000001": 3},
}


def test_everyday_values_are_stored_and_replayed(led: Ledger, dsn: str) -> None:
    first = led.run("t", returns(EVERYDAY), {}, key="k")
    assert first.status == "succeeded", first.error
    replay = led.run("t", returns(EVERYDAY), {}, key="k")
    assert replay.replay and same(first.result, EVERYDAY_JSON) and same(replay.result, first.result)
    # Each value alone too: a tool may return a bare datetime or model.
    for name, value in EVERYDAY.items():
        ex = led.run("t", returns(value), {}, key=f"one-{name}")
        assert same(ex.result, EVERYDAY_JSON[name]), name
        assert same(led.run("t", returns(value), {}, key=f"one-{name}").result, ex.result), name


# --- encoder= ------------------------------------------------------------------------------

class Money:
    """A type no encoder knows."""

    def __init__(self, cents: int) -> None:
        self.cents = cents


def money(value: Any) -> Any:
    """The documented recipe: pydantic-core for everything, a fallback for our own types."""
    return to_jsonable_python(value, fallback=lambda o: {"cents": o.cents})


def test_an_encoder_on_the_ledger_and_on_run(dsn: str) -> None:
    result = {"price": Money(1250), "at": AT}
    with Ledger(dsn, tenant_id="t1", encoder=money) as led:
        ex = led.run("t", returns(result), {}, key="a")
        assert same(ex.result, {"price": {"cents": 1250}, "at": "2026-11-30T15:04:05.123456Z"})
        assert same(led.run("t", returns(result), {}, key="a").result, ex.result)
        # run's encoder wins over the ledger's.
        ex = led.run("t", returns(result), {}, key="b", encoder=lambda v: {"summary": repr(v)[:6]})
        assert same(ex.result, {"summary": "{'pric"})
        many = led.run_many([Call("t", returns(Money(1)), {}, "c")], encoder=lambda v: v.cents)
        assert many[0].result == 1 and led.run("t", returns(None), {}, key="c").result == 1
    with Ledger(dsn, tenant_id="t1") as plain:
        ex = plain.run("t", returns(Money(5)), {}, key="d", encoder=money)
        assert same(ex.result, {"cents": 5})


def test_what_an_encoder_returns_is_still_checked(led: Ledger, dsn: str) -> None:
    with pytest.raises(UnstorableResult, match="the encoder returned what is not JSON"):
        led.run("t", returns(1), {}, key="a", encoder=lambda v: {v})
    with pytest.raises(UnstorableResult, match="the encoder cannot convert it: KeyError"):
        led.run("t", returns(1), {}, key="b", encoder=lambda v: {}["missing"])
    assert [led.run("t", returns(1), {}, key=k).status for k in "ab"] == ["unknown", "unknown"]
    with pytest.raises(InvalidArgument, match="encoder must be None or callable"):
        led.run("t", returns(1), {}, key="c", encoder="json")  # type: ignore[arg-type]
    assert count_rows(dsn) == 2


# --- args stay strict JSON -------------------------------------------------------------------

BAD_ARGS = [({"ids": {1, 2}}, "set"), ({"when": object()}, "object"), ({"x": math.nan}, "NaN"),
            ({"x": [math.inf]}, "Infinity"), ({"amount": Decimal("1.5")}, "Decimal"),
            ({"at": AT}, "datetime")]


@pytest.mark.parametrize("args, what", BAD_ARGS, ids=[w for _, w in BAD_ARGS])
def test_args_that_are_not_strict_json_are_refused_before_anything_is_written(
        led: Ledger, dsn: str, args: dict[str, Any], what: str) -> None:
    tool = returns("ran")
    with pytest.raises(InvalidArgument, match=r"^args is not JSON-serialisable"):
        led.run("t", tool, args, key="k")
    with pytest.raises(InvalidArgument, match=r"^args is not JSON-serialisable"):
        led.run_many([Call("t", tool, {}, "ok"), Call("t", tool, args, "k")])

    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1") as aled:
            with pytest.raises(InvalidArgument, match=r"^args is not JSON-serialisable"):
                await aled.run("t", tool, args, key="k")

    asyncio.run(main())
    assert count_rows(dsn) == 0


# --- results that cannot be stored --------------------------------------------------------

class Opaque:
    def __repr__(self) -> str:
        return "Opaque(charge='ch_9', amount=1250)"


class Huge:
    def __repr__(self) -> str:
        return "H" * 10_000


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


UNSTORABLE = [
    (Opaque(), "pydantic-core cannot convert it", "Opaque(charge='ch_9', amount=1250)"),
    ({"rate": math.nan}, "NaN is not a JSON number", "{'rate': nan}"),
    ([math.inf], "Infinity is not a JSON number", "[inf]"),
    ("a\x00b", "NUL", "'a\\x00b'"),
    (b"\xff", "cannot convert it: .*invalid utf-8", "b'\\xff'"),
    (Huge(), "cannot convert it", "H" * 2000 + "..."),
    (BrokenRepr(), "cannot convert it",
     f"<{__name__}.BrokenRepr: repr() failed: RuntimeError: no repr>"),
]


@pytest.mark.parametrize("result, why, shown", UNSTORABLE,
                         ids=["object", "nan", "inf", "nul", "bytes", "long-repr", "bad-repr"])
def test_an_unstorable_result_is_unknown_with_its_repr_in_the_error(
        led: Ledger, result: Any, why: str, shown: str) -> None:
    with pytest.raises(UnstorableResult, match=why) as info:
        led.run("charge", returns(result), {}, key="k")
    assert info.value.result is result and info.value.result_repr == shown
    action = led.get("k")
    assert action is not None and action.state == "unknown"
    cls = type(result)
    assert action.error == {
        "type": "replaysafe_pg.errors.UnstorableResult", "reason": "unstorable_result",
        "message": str(info.value), "result_type": f"{cls.__module__}.{cls.__qualname__}",
        "result_repr": shown}
    replay = led.run("charge", returns(result), {}, key="k")
    assert (replay.status, replay.error) == ("unknown", action.error)


def test_an_unstorable_result_is_unknown_with_its_repr_async(dsn: str) -> None:
    async def tool() -> Any:
        return Opaque()

    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1") as led:
            with pytest.raises(UnstorableResult) as info:
                await led.run("charge", tool, {}, key="k")
            action = await led.get("k")
            assert action is not None and action.state == "unknown"
            assert action.error["result_repr"] == info.value.result_repr == repr(Opaque())

    asyncio.run(main())
