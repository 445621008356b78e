"""Size limits (docs/python.md#size-limits): what the driver's own compact JSON encoding shows
is over a limit is refused before anything is sent; a result over its limit, which comes
after the side effect, is recorded as an ``unknown`` action instead of being shipped.

Statements are counted on the wire: libpq traces every message the connection sends, so a
statement sent by any path of the driver shows up (the tests that expect one see it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from helpers.run import action_row
from psycopg import pq

from replaysafe_pg import (
    AsyncLedger,
    AsyncThreads,
    InvalidArgument,
    Ledger,
    Limits,
    Threads,
    UnstorableResult,
)
from replaysafe_pg.limits import MIB

OVHEAD = len('{"b":""}')  # the JSON around a request {"b": "..."}


@dataclass
class Wire:
    """The frontend messages a connection sent while traced: (type, length) each."""

    messages: list[tuple[str, int]] = field(default_factory=list)

    @property
    def statements(self) -> int:
        return sum(1 for kind, _ in self.messages if kind in ("Query", "Execute"))

    @property
    def largest(self) -> int:
        return max((n for _, n in self.messages), default=0)


@contextlib.contextmanager
def traced(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Iterator[Wire]:
    wire = Wire()
    with tempfile.TemporaryFile() as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield wire
        finally:
            conn.pgconn.untrace()
            f.seek(0)
            for line in f:
                # "F\t<length>\t<type>\t...": a message from the frontend (the driver).
                if line.startswith(b"F\t"):
                    _, length, kind = line.split(b"\t", 3)[:3]
                    wire.messages.append((kind.strip().decode(), int(length)))


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(f"SELECT count(*) FROM replaysafe.{table}").fetchone()
    assert row is not None
    return int(row[0])


def warmed(led: Ledger) -> Ledger:
    """``led`` after its first statement (the first use of a connection also asks the
    server about its session, once): later counts are the calls' own statements."""
    assert led.get("warm-up") is None
    return led


def request_of(size: int, char: str = "x") -> dict[str, str]:
    """A request whose compact JSON is ``size`` bytes in UTF-8 (``char`` of 1 or 2 bytes)."""
    width = len(char.encode())
    body, rest = divmod(size - OVHEAD, width)
    return {"b": char * body + "x" * rest}


class Tool:
    def __init__(self, result: Any) -> None:
        self.result = result
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.result


# --- requests ---------------------------------------------------------------------------

def test_a_request_over_its_limit_is_refused_at_once_and_nothing_is_sent(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    led = Ledger(conn, tenant_id="t1")
    big = request_of(2 * MIB)
    tool = Tool({"ok": True})
    with traced(conn) as wire:
        started = time.monotonic()
        with pytest.raises(InvalidArgument) as claimed:
            led.claim("k", "op", big)
        with pytest.raises(InvalidArgument) as ran:
            led.run("op", tool, big, key="k")
        with pytest.raises(InvalidArgument):
            led.claim_many([("k1", "op", {}), ("k2", "op", big)])
        with pytest.raises(InvalidArgument):
            led.run_many([("op", tool, {}, "k1"), ("op", tool, big, "k2")])
        elapsed = time.monotonic() - started
    assert str(claimed.value) == (
        "request is 2,097,152 bytes encoded, over the 1,048,576-byte limit of a request "
        "(docs/python.md#size-limits)")
    assert str(ran.value).startswith("args is 2,097,152 bytes encoded, over the 1,048,576-byte")
    assert elapsed < 1.0
    assert wire.messages == [] and tool.calls == 0
    assert count(dsn, "actions") == 0


@pytest.mark.parametrize("char", ["x", "é"])
def test_a_request_exactly_at_its_limit_is_sent_and_one_byte_more_is_not(
        conn: psycopg.Connection[Any], char: str) -> None:
    led = warmed(Ledger(conn, tenant_id="t1"))
    at_limit, over = request_of(MIB, char), request_of(MIB + 1, char)
    assert len(json.dumps(at_limit, separators=(",", ":"), ensure_ascii=False).encode()) == MIB
    with traced(conn) as refused, pytest.raises(InvalidArgument,
                                                 match="is 1,048,577 bytes encoded"):
        led.claim("k", "op", over)
    assert refused.statements == 0
    # The database is the authority on what it stores (its limit is measured as jsonb): it
    # may accept this request or refuse it; either way the driver sent it.
    with traced(conn) as sent, contextlib.suppress(InvalidArgument):
        assert led.claim("k", "op", at_limit).outcome == "claimed"
    assert sent.statements == 1 and sent.largest > MIB


def test_a_number_over_1000_digits_is_refused(conn: psycopg.Connection[Any], dsn: str) -> None:
    led = warmed(Ledger(conn, tenant_id="t1"))
    threads = Threads(conn, tenant_id="t1")
    with traced(conn) as wire:
        for value, digits in ((10 ** 1000, "1,001"), (-(10 ** 1000), "1,001"),
                              (10 ** 5000, "5,001"), ([1, {"n": 10 ** 2000}], "2,001")):
            with pytest.raises(InvalidArgument, match=f"holds a number of {digits} digits, "
                               "over the 1,000-digit limit"):
                led.claim("k", "op", {"n": value})
            with pytest.raises(InvalidArgument, match=f"state holds a number of {digits}"):
                threads.write("th", {"n": value}, 0)
        with pytest.raises(InvalidArgument, match="1,001 digits"):
            led.claim("k", "op", {str(10 ** 1000 + 1): 1, "n": 10 ** 1000})
        # A Decimal is not JSON to the driver at all (its encoding is the caller's choice).
        with pytest.raises(InvalidArgument, match="not JSON-serialisable"):
            led.claim("k", "op", {"n": Decimal("1" * 1001)})
    assert wire.messages == []
    with traced(conn) as wire:
        # 1,000 digits is within the limit; so is a string of digits of any length.
        assert led.claim("k", "op", {"n": 10 ** 999, "s": "7" * 5000}).outcome == "claimed"
    assert wire.statements == 1
    assert action_row(dsn, "k")["request"]["n"] == 10 ** 999


def test_other_limits_can_be_given_and_are_checked(conn: psycopg.Connection[Any],
                                                   dsn: str) -> None:
    small = Limits(request=100, error=50, provider_reference=10, thread_state=20,
                   number_digits=5)
    led = Ledger(conn, tenant_id="t1", limits=small)
    assert led.limits is small
    with traced(conn) as wire:
        with pytest.raises(InvalidArgument, match="over the 100-byte limit of a request"):
            led.claim("k", "op", request_of(101))
        with pytest.raises(InvalidArgument, match="over the 5-digit limit"):
            led.claim("k", "op", {"n": 123456})
        with pytest.raises(InvalidArgument, match="over the 20-byte limit of a thread state"):
            Threads(conn, tenant_id="t1", limits=small).write("th", {"s": "x" * 20}, 0)
    assert wire.messages == []
    claim = led.claim("k", "op", request_of(100))
    with pytest.raises(InvalidArgument, match="error is 51 bytes encoded"):
        led.fail(claim, {"m": "x" * 43})
    # A provider reference comes after the side effect, as a result does: recorded, not
    # refused (10 bytes with its header; 11 would be over).
    with traced(conn) as wire:
        assert led.complete(claim, {}, provider_reference="r" * 7) == "recorded"
    assert wire.statements == 1
    assert (row := action_row(dsn, "k"))["state"] == "unknown"
    assert row["error"] == {"reason": "result_too_large", "provider_reference_bytes": 11}
    assert row["provider_reference"] is None
    # resolve() is not after a side effect of its own: refused there.
    with pytest.raises(InvalidArgument, match=r"provider_reference is 11 bytes stored \(7 and "
                       r"a 4-byte header\), over the 10-byte limit of a provider reference"):
        led.resolve("k", "succeeded", result={}, provider_reference="r" * 7)
    other = led.claim("k2", "op", request_of(100))
    assert led.complete(other, {}, provider_reference="r" * 6) == "recorded"
    assert (row := action_row(dsn, "k2"))["state"] == "succeeded"
    assert row["provider_reference"] == "r" * 6
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(InvalidArgument, match=r"Limits\.request must be a positive int"):
            Limits(request=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"limits must be a replaysafe_pg\.Limits"):
        Ledger(conn, limits={"request": 1})  # type: ignore[arg-type]


# --- results ----------------------------------------------------------------------------

def test_a_result_over_its_limit_through_run_is_recorded_unknown_without_it(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    led = warmed(Ledger(conn, tenant_id="t1"))
    tool = Tool({"blob": "x" * (2 * MIB)})
    with traced(conn) as wire:
        ex = led.run("export", tool, {}, key="k")
    size = 2 * MIB + len('{"blob":""}')
    assert (ex.status, ex.result, ex.error, ex.outcome) == (
        "unknown", None, {"reason": "result_too_large", "bytes": size}, "recorded")
    assert wire.statements == 2 and wire.largest < 4096  # the claim and mark_action_unknown
    row = action_row(dsn, "k")
    assert (row["state"], row["result"]) == ("unknown", None)
    assert row["error"] == {"reason": "result_too_large", "bytes": size}
    again = led.run("export", tool, {}, key="k")
    assert (again.status, again.replay, again.error["reason"]) == (
        "unknown", True, "result_too_large")
    assert tool.calls == 1


def test_a_result_within_the_drivers_limit_but_over_the_stored_one_is_reported_unknown(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    # 2 bytes of compact JSON a number, about 12 of jsonb: under 1 MiB sent, over it stored.
    led = warmed(Ledger(conn, tenant_id="t1"))
    tool = Tool([1] * 200_000)
    ex = led.run("export", tool, {}, key="k")
    assert (ex.status, ex.result, ex.outcome) == ("unknown", None, "recorded")
    assert ex.error["reason"] == "result_too_large" and ex.error["bytes"] > MIB
    row = action_row(dsn, "k")
    assert (row["state"], row["error"]) == ("unknown", ex.error)
    small = led.run("export", Tool([1] * 1000), {}, key="k2")  # no read for a small result
    assert small.status == "succeeded"


@pytest.mark.parametrize("number, digits", [(10 ** 1000, 1001), (-(10 ** 6000), 6001)],
                         ids=["1001-digits", "6001-digits-negative"])
@pytest.mark.parametrize("encoder", [None, "identity"])
def test_a_result_with_a_number_over_1000_digits_through_run_is_recorded_unknown(
        dsn: str, number: int, digits: int, encoder: str | None) -> None:
    with Ledger(dsn, tenant_id="t1",
                encoder=None if encoder is None else (lambda value: value)) as led:
        ex = led.run("count", Tool({"n": number}), {}, key="k")
    assert (ex.status, ex.error) == ("unknown", {"reason": "result_too_large", "digits": digits})
    assert action_row(dsn, "k")["error"] == {"reason": "result_too_large", "digits": digits}


def test_a_result_over_its_limit_through_async_run_is_recorded_unknown(dsn: str) -> None:
    async def tool() -> Any:
        return "é" * MIB

    async def main() -> Any:
        async with AsyncLedger(dsn, tenant_id="t1") as led:
            return await led.run("export", tool, {}, key="k")

    ex = asyncio.run(main())
    assert (ex.status, ex.error) == ("unknown", {"reason": "result_too_large",
                                                 "bytes": 2 * MIB + 2})
    assert action_row(dsn, "k")["state"] == "unknown"


def test_a_result_at_its_limit_through_run_is_sent(conn: psycopg.Connection[Any]) -> None:
    led = Ledger(conn, tenant_id="t1")
    with traced(conn) as wire:
        # Sent; its jsonb (12 bytes of headers more) is over the database's limit, which
        # records it unknown, and the run says so.
        ex = led.run("export", Tool("x" * (MIB - 2)), {}, key="k")
    assert wire.largest > MIB
    assert (ex.status, ex.error) == ("unknown", {"reason": "result_too_large", "bytes": MIB + 10})


def test_complete_with_a_result_over_its_limit_records_the_action_unknown(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    led = Ledger(conn, tenant_id="t1")
    claim = led.claim("k", "export", {})
    with traced(conn) as wire:
        assert led.complete(claim, ["x" * MIB], provider_reference="exp_42") == "recorded"
    assert wire.statements == 1 and wire.largest < 4096
    row = action_row(dsn, "k")
    assert (row["state"], row["result"]) == ("unknown", None)
    assert row["error"] == {"reason": "result_too_large", "bytes": MIB + 4,
                            "provider_reference": "exp_42"}
    # A number too long for Python to print is measured without printing it.
    other = led.claim("k2", "export", {})
    assert led.complete(other, {"n": 10 ** 4500}) == "recorded"
    assert action_row(dsn, "k2")["error"] == {"reason": "result_too_large", "digits": 4501}


def test_async_complete_with_a_result_over_its_limit_records_the_action_unknown(
        dsn: str) -> None:
    async def main() -> str:
        async with AsyncLedger(dsn, tenant_id="t1") as led:
            claim = await led.claim("k", "export", {})
            return await led.complete(claim, "x" * (2 * MIB))

    assert asyncio.run(main()) == "recorded"
    assert action_row(dsn, "k")["error"] == {"reason": "result_too_large", "bytes": 2 * MIB + 2}


@pytest.mark.parametrize("char", ["r", "é"])
def test_a_provider_reference_at_its_limit_is_stored_and_one_byte_more_recorded_unknown(
        conn: psycopg.Connection[Any], dsn: str, char: str) -> None:
    # The database measures a text as stored (pg_column_size): its bytes and a 4-byte header.
    led = warmed(Ledger(conn, tenant_id="t1"))
    width = len(char.encode())
    body, rest = divmod(MIB - 4, width)
    at_limit = char * body + "r" * rest
    claim = led.claim("k", "export", {})
    assert led.complete(claim, {"id": 1}, provider_reference=at_limit) == "recorded"
    row = action_row(dsn, "k")
    assert (row["state"], row["provider_reference"]) == ("succeeded", at_limit)
    over = at_limit + "r"
    other = led.claim("k2", "export", {})
    with traced(conn) as wire:
        assert led.complete(other, {"id": 2}, provider_reference=over) == "recorded"
    assert wire.statements == 1 and wire.largest < 4096  # mark_action_unknown, without it
    row = action_row(dsn, "k2")
    assert (row["state"], row["result"], row["provider_reference"]) == ("unknown", None, None)
    assert row["error"] == {"reason": "result_too_large", "provider_reference_bytes": MIB + 1}


def test_a_provider_reference_the_database_finds_over_its_limit_is_measured_alike(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    # A driver with a larger limit sends it: the database records what the driver would.
    led = Ledger(conn, tenant_id="t1", limits=Limits(provider_reference=2 * MIB))
    claim = led.claim("k", "export", {})
    assert led.complete(claim, {"id": 1}, provider_reference="r" * (MIB - 3)) == "recorded"
    row = action_row(dsn, "k")
    assert (row["state"], row["provider_reference"]) == ("unknown", None)
    assert row["error"] == {"reason": "result_too_large", "provider_reference_bytes": MIB + 1}


def test_a_provider_reference_over_its_limit_with_a_result_over_its_own_names_the_reference(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    led = Ledger(conn, tenant_id="t1", limits=Limits(provider_reference=10))
    claim = led.claim("k", "export", {})
    assert led.complete(claim, "x" * (2 * MIB), provider_reference="r" * 10) == "recorded"
    assert action_row(dsn, "k")["error"] == {"reason": "result_too_large",
                                             "provider_reference_bytes": 14}
    # A reference that fits is kept in the error of a result too large.
    other = led.claim("k2", "export", {})
    assert led.complete(other, "x" * (2 * MIB), provider_reference="r" * 6) == "recorded"
    assert action_row(dsn, "k2")["error"] == {"reason": "result_too_large",
                                              "bytes": 2 * MIB + 2, "provider_reference": "r" * 6}


def test_async_complete_with_a_provider_reference_over_its_limit_records_the_action_unknown(
        dsn: str) -> None:
    async def main() -> str:
        async with AsyncLedger(dsn, tenant_id="t1", limits=Limits(provider_reference=10)) as led:
            claim = await led.claim("k", "export", {})
            return await led.complete(claim, {"id": 1}, provider_reference="ré" * 4)

    assert asyncio.run(main()) == "recorded"
    row = action_row(dsn, "k")
    assert (row["state"], row["result"]) == ("unknown", None)
    assert row["error"] == {"reason": "result_too_large", "provider_reference_bytes": 16}


def test_resolve_with_a_result_over_its_limit_is_refused(conn: psycopg.Connection[Any],
                                                         dsn: str) -> None:
    led = Ledger(conn, tenant_id="t1")
    claim = led.claim("k", "export", {})
    led.mark_unknown(claim, {"why": "test"})
    with traced(conn) as wire, pytest.raises(InvalidArgument,
                                              match="result is 2,097,154 bytes encoded"):
        led.resolve("k", "succeeded", result="x" * (2 * MIB))
    assert wire.messages == []
    assert action_row(dsn, "k")["state"] == "unknown"


# --- thread state -------------------------------------------------------------------------

def test_a_thread_state_over_32_mib_is_refused_before_anything_is_sent(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    threads = Threads(conn, tenant_id="t1")
    big = {"s": "x" * (32 * MIB)}
    with traced(conn) as wire:
        started = time.monotonic()
        with pytest.raises(InvalidArgument, match=r"state is 33,554,440 bytes encoded, over "
                           r"the 33,554,432-byte limit of a thread state"):
            threads.write("th", big, 0)
        elapsed = time.monotonic() - started
    assert wire.messages == [] and elapsed < 2.0
    assert count(dsn, "threads") == 0


def test_an_async_thread_state_over_32_mib_is_refused(dsn: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            threads = AsyncThreads(aconn, tenant_id="t1")
            with traced(aconn) as wire, pytest.raises(InvalidArgument,
                                                      match="over the 33,554,432-byte limit"):
                await threads.write("th", {"s": "é" * (16 * MIB)}, 0)
            assert wire.messages == []

    asyncio.run(main())


# --- LangGraph ----------------------------------------------------------------------------

def test_a_saver_put_or_write_over_its_limit_is_refused(conn: psycopg.Connection[Any],
                                                        dsn: str) -> None:
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from replaysafe_pg.langgraph import ReplaysafeSaver

    saver = ReplaysafeSaver(conn, tenant_id="t1")
    config: Any = {"configurable": {"thread_id": "th", "checkpoint_ns": ""}}
    # Measured as the database stores them, their bytes and a 4-byte header: one byte over.
    big = (os.urandom(1024) * (32 * 1024))[:-3]
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"files": big}
    with traced(conn) as wire:
        with pytest.raises(InvalidArgument, match="the value of channel 'files' is "
                           r"33,554,433 bytes stored \(33,554,429 and a 4-byte header\), over "
                           "the 33,554,432-byte limit of a LangGraph channel value"):
            saver.put(config, checkpoint, {"source": "input", "step": -1}, {"files": "1"})
        with pytest.raises(InvalidArgument, match="the checkpoint's metadata is"):
            saver.put(config, empty_checkpoint(),
                      {"source": "input", "step": -1, "note": "x" * (32 * MIB)}, {})
        with pytest.raises(InvalidArgument, match="holds a number of 1,001 digits"):
            saver.put(config, empty_checkpoint(), {"source": "input", "step": 10 ** 1000}, {})
        with pytest.raises(InvalidArgument, match="the pending write to channel 'files' is"):
            saver.put_writes({"configurable": {**config["configurable"], "checkpoint_id": "c"}},
                             [("files", big)], "task")
    assert wire.messages == []
    assert count(dsn, "langgraph_checkpoints") + count(dsn, "langgraph_blobs") == 0
    small = ReplaysafeSaver(conn, tenant_id="t1", limits=Limits(blob=1000))
    assert small.limits.blob == 1000
    checkpoint["channel_values"] = {"files": b"x" * 2000}
    with pytest.raises(InvalidArgument, match="over the 1,000-byte limit"):
        small.put(config, checkpoint, {"source": "input", "step": -1}, {"files": "1"})
    saver.put(config, checkpoint, {"source": "input", "step": -1}, {"files": "1"})
    assert count(dsn, "langgraph_blobs") == 1


def test_a_channel_value_at_its_limit_is_stored_and_one_byte_more_is_not_sent(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from replaysafe_pg.langgraph import ReplaysafeSaver

    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("UPDATE replaysafe.limits SET blob_bytes = 1000")
    config: Any = {"configurable": {"thread_id": "th", "checkpoint_ns": ""}}
    metadata: Any = {"source": "input", "step": -1}

    def put(saver: ReplaysafeSaver, size: int, version: str) -> None:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"files": os.urandom(size)}
        saver.put(config, checkpoint, metadata, {"files": version})

    saver = ReplaysafeSaver(conn, tenant_id="t1", limits=Limits(blob=1000))
    put(saver, 996, "1")  # 1,000 bytes stored: what the database accepts
    assert count(dsn, "langgraph_blobs") == 1
    with traced(conn) as wire, pytest.raises(InvalidArgument, match=r"is 1,001 bytes stored "
                                              r"\(997 and a 4-byte header\), over the "
                                              "1,000-byte limit"):
        put(saver, 997, "2")
    assert wire.messages == []
    # Sent by a driver that allows more, the database refuses it: the same measure.
    larger = ReplaysafeSaver(conn, tenant_id="t1", limits=Limits(blob=2000))
    with pytest.raises(InvalidArgument, match="1001 bytes stored"):
        put(larger, 997, "3")
    assert count(dsn, "langgraph_blobs") == 1


# --- statements the server refuses for their size or content ------------------------------

def _shallow_stack(dsn: str) -> str:
    """A DSN whose sessions may parse only shallow JSON (a superuser's setting)."""
    with psycopg.connect(dsn) as c:
        if c.execute("SELECT current_setting('is_superuser')").fetchone() != ("on",):
            pytest.skip("needs a superuser to lower max_stack_depth")
    return psycopg.conninfo.make_conninfo(dsn, options="-c max_stack_depth=100kB")


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_claim_the_server_refuses_for_its_size_is_not_retried(dsn: str) -> None:
    # 54001 (stack depth limit exceeded) while the server reads the request's jsonb.
    with Ledger(_shallow_stack(dsn), tenant_id="t1") as led:
        tool = Tool({"ok": True})
        started = time.monotonic()
        with pytest.raises(InvalidArgument, match="stack depth limit exceeded"):
            led.run("op", tool, {"deep": nested(800)}, key="k", lease=20)
        assert time.monotonic() - started < 5  # a retry would go on for the 20 s lease
        assert tool.calls == 0
        with pytest.raises(InvalidArgument, match="stack depth limit exceeded"):
            led.claim("k", "op", {"deep": nested(800)})
    assert count(dsn, "actions") == 0


def test_a_record_the_server_refuses_for_its_size_is_not_retried(dsn: str) -> None:
    with Ledger(_shallow_stack(dsn), tenant_id="t1", encoder=lambda value: value) as led:
        tool = Tool({"deep": nested(800)})
        started = time.monotonic()
        with pytest.raises(UnstorableResult, match="the database refused it"):
            led.run("op", tool, {}, key="k", lease=20)
        assert time.monotonic() - started < 5
    row = action_row(dsn, "k")
    assert (row["state"], row["error"]["reason"]) == ("unknown", "unstorable_result")
    assert tool.calls == 1
