"""Ledger.run and run_many: what a single caller sees (real Postgres, no mocks)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import derived_key
from helpers.run import action_row, attempt_rows

from replaysafe_pg import (
    ActionNotSucceeded,
    Call,
    Execution,
    InvalidArgument,
    Ledger,
    OutcomeNotRecorded,
    UnstorableResult,
    keys,
)


class Tool:
    """Counts its calls; returns or raises what it is told."""

    def __init__(self, result: Any = None, raises: BaseException | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.result = result if result is not None else {"ok": True}
        self.raises = raises

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if self.raises is not None:
            raise self.raises
        return self.result


def count_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM replaysafe.actions").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def led(dsn: str) -> Iterator[Ledger]:
    with Ledger(dsn, tenant_id="t1", worker_id="w1") as ledger:
        yield ledger


# --- first call and replay -------------------------------------------------------------

def test_first_call_runs_the_tool_and_later_calls_replay_it(led: Ledger, dsn: str) -> None:
    tool = Tool({"refund_id": "re_1"})
    first = led.run("refund", tool, {"order": 42}, key="k")
    assert (first.status, first.result, first.replay, first.attempt, first.outcome) == (
        "succeeded", {"refund_id": "re_1"}, False, 1, "recorded")
    assert first.idempotency_key == derived_key(dsn, "t1", "k")
    again = led.run("refund", tool, {"order": 42}, key="k")
    assert (again.status, again.result, again.replay, again.outcome) == (
        "succeeded", {"refund_id": "re_1"}, True, None)
    assert len(tool.calls) == 1
    assert action_row(dsn, "k")["state"] == "succeeded"
    assert again.unwrap() == {"refund_id": "re_1"}


def test_fn_that_takes_idempotency_key_gets_the_derived_key(led: Ledger, dsn: str) -> None:
    seen: list[str] = []

    def charge(amount: int, idempotency_key: str) -> int:
        seen.append(idempotency_key)
        return amount

    ex = led.run("charge", charge, {"amount": 5}, key="c1")
    assert seen == [derived_key(dsn, "t1", "c1")] == [ex.idempotency_key]

    def no_key(**kwargs: Any) -> Any:  # **kwargs alone does not ask for the key
        return sorted(kwargs)

    assert led.run("echo", no_key, {"a": 1}, key="c2").result == ["a"]


def test_the_same_key_reaches_every_attempt(led: Ledger) -> None:
    seen: list[str] = []

    def flaky(idempotency_key: str) -> str:
        seen.append(idempotency_key)
        if len(seen) == 1:
            raise ConnectionError("provider timed out before accepting")
        return "ok"

    first = led.run("flaky", flaky, {}, key="f", retryable=ConnectionError)
    assert (first.status, first.retryable, first.attempt) == ("failed", True, 1)
    assert isinstance(first.exception, ConnectionError)
    second = led.run("flaky", flaky, {}, key="f", retryable=ConnectionError)
    assert (second.status, second.attempt, second.result) == ("succeeded", 2, "ok")
    assert seen[0] == seen[1] == second.idempotency_key


# --- exceptions ------------------------------------------------------------------------

def test_an_exception_is_a_terminal_failure_replayed_to_later_callers(led: Ledger, dsn: str) -> None:
    tool = Tool(raises=ValueError("card declined"))
    first = led.run("charge", tool, {}, key="k")
    assert (first.status, first.replay, first.retryable) == ("failed", False, False)
    assert first.error == {"type": "builtins.ValueError", "message": "card declined"}
    later = led.run("charge", tool, {}, key="k")
    assert (later.status, later.replay, later.error) == ("failed", True, first.error)
    assert later.exception is None and len(tool.calls) == 1
    assert action_row(dsn, "k")["state"] == "failed"
    with pytest.raises(ActionNotSucceeded, match="failed"):
        later.unwrap()


def test_retryable_predicate_marks_the_action_retryable(led: Ledger, dsn: str) -> None:
    tool = Tool(raises=RuntimeError("429 Too Many Requests"))
    ex = led.run("api", tool, {}, key="k", retryable=lambda e: "429" in str(e))
    assert (ex.status, ex.retryable) == ("failed", True)
    assert action_row(dsn, "k")["state"] == "retryable"
    led.run("api", tool, {}, key="k", retryable=lambda e: "429" in str(e))
    assert len(tool.calls) == 2  # retryable: the next call runs it again


def test_keyboard_interrupt_marks_unknown_and_propagates(led: Ledger, dsn: str) -> None:
    tool = Tool(raises=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        led.run("charge", tool, {}, key="k")
    row = action_row(dsn, "k")
    assert row["state"] == "unknown" and row["error"]["reason"] == "interrupted"
    again = led.run("charge", tool, {}, key="k")
    assert (again.status, again.replay) == ("unknown", True)
    assert len(tool.calls) == 1


def test_timeout_marks_unknown_without_waiting_for_the_tool(led: Ledger, dsn: str) -> None:
    def slow() -> str:
        time.sleep(1.0)
        return "late"

    t0 = time.monotonic()
    ex = led.run("slow", slow, {}, key="k", timeout=0.2)
    assert time.monotonic() - t0 < 0.8
    assert (ex.status, ex.error["reason"], ex.outcome) == ("unknown", "timeout", "recorded")
    assert action_row(dsn, "k")["state"] == "unknown"
    # A fast tool under a timeout still succeeds.
    assert led.run("fast", lambda: 1, {}, key="k2", timeout=5).result == 1


def test_a_coroutine_function_is_refused_by_the_sync_ledger_before_claiming(
        led: Ledger, dsn: str) -> None:
    async def tool() -> int:
        return 1

    with pytest.raises(InvalidArgument, match="AsyncLedger"):
        led.run("t", tool, {}, key="k")
    assert count_rows(dsn) == 0


def test_a_sync_function_returning_a_coroutine_is_refused_and_left_retryable(
        led: Ledger, dsn: str) -> None:
    async def inner() -> int:
        return 1

    with pytest.raises(InvalidArgument, match="awaitable"):
        led.run("t", lambda: inner(), {}, key="k")
    assert action_row(dsn, "k")["state"] == "retryable"


# --- args and results that cannot be stored -------------------------------------------

@pytest.mark.parametrize("args", [{"when": object()}, {"x": math.nan}, {"s": "a\x00b"},
                                  ["not", "a", "dict"], {1: "int key"}])
def test_args_that_are_not_a_json_object_are_refused_and_nothing_is_written(
        led: Ledger, dsn: str, args: Any) -> None:
    tool = Tool()
    with pytest.raises(InvalidArgument):
        led.run("t", tool, args, key="k")
    assert tool.calls == [] and count_rows(dsn) == 0


@pytest.mark.parametrize("result, why", [({"x": math.nan}, "NaN is not a JSON number"),
                                         ("a\x00b", "NUL"), (object(), "cannot convert it"),
                                         ("\ud800", "surrogates not allowed")])
def test_an_unstorable_result_marks_unknown_raises_and_never_reruns(
        led: Ledger, dsn: str, result: Any, why: str) -> None:
    tool = Tool(result)
    with pytest.raises(UnstorableResult, match=why) as info:
        led.run("t", tool, {}, key="k")
    assert info.value.result is result
    row = action_row(dsn, "k")
    assert row["state"] == "unknown" and row["error"]["reason"] == "unstorable_result"
    assert why in row["error"]["message"]
    assert led.run("t", tool, {}, key="k").status == "unknown"
    assert len(tool.calls) == 1


def test_exception_messages_that_jsonb_refuses_are_cleaned(led: Ledger) -> None:
    ex = led.run("t", Tool(raises=ValueError("nul\x00 and \ud800")), {}, key="k")
    assert ex.status == "failed" and "\x00" not in ex.error["message"]


# --- waiting ---------------------------------------------------------------------------

def test_wait_timeout_zero_answers_running_at_once(led: Ledger, dsn: str) -> None:
    other = Ledger(dsn, tenant_id="t1", worker_id="w2")
    try:
        def tool() -> str:
            t0 = time.monotonic()
            ex = other.run("t", Tool(), {}, key="k", wait_timeout=0)
            assert time.monotonic() - t0 < 0.5
            assert (ex.status, ex.replay, ex.attempt) == ("running", False, 1)
            return "done"

        assert led.run("t", tool, {}, key="k").result == "done"
    finally:
        other.close()


def test_waiting_with_a_single_given_connection(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner_conn, \
            psycopg.connect(dsn, autocommit=True) as waiter_conn:
        owner = Ledger(owner_conn, tenant_id="t1", worker_id="w1")
        waiter = Ledger(waiter_conn, tenant_id="t1", worker_id="w2")
        claim = owner.claim("k", "t", {})
        import threading
        finisher = threading.Timer(0.3, lambda: owner.complete(claim, "fine"))
        finisher.start()
        ex = waiter.run("t", Tool(), {}, key="k", wait_timeout=5)
        finisher.join()
        assert (ex.status, ex.result, ex.replay) == ("succeeded", "fine", True)
        # The LISTEN is gone again: the connection is the caller's.
        assert waiter_conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        owner.close()
        waiter.close()


# --- run_many --------------------------------------------------------------------------

def test_run_many_claims_in_one_round_trip_and_answers_in_input_order(led: Ledger) -> None:
    done = led.run("lookup", Tool("cached"), {"q": 1}, key="m:0")
    assert done.result == "cached"
    a, b = Tool("A"), Tool(raises=ValueError("boom"))
    calls: list[Any] = [("lookup", Tool("never"), {"q": 1}, "m:0"),
                        Call("write", a, {"x": 1}, "m:1"),
                        ("write", b, {"x": 2}, "m:2")]
    out = led.run_many(calls)
    assert [(e.status, e.result, e.replay) for e in out] == [
        ("succeeded", "cached", True), ("succeeded", "A", False), ("failed", None, False)]
    assert len(a.calls) == len(b.calls) == 1
    again = led.run_many(calls)
    assert [e.replay for e in again] == [True, True, True]
    assert [e.status for e in again] == ["succeeded", "succeeded", "failed"]


def test_run_many_refuses_repeated_keys_and_bad_args_before_claiming(led: Ledger, dsn: str) -> None:
    with pytest.raises(InvalidArgument, match="own key"):
        led.run_many([("t", Tool(), {}, "k"), ("t", Tool(), {}, "k")])
    with pytest.raises(InvalidArgument):
        led.run_many([("t", Tool(), {}, "k1"), ("t", Tool(), {"x": math.inf}, "k2")])
    assert count_rows(dsn) == 0
    assert led.run_many([]) == []


# --- recording through a dropped connection ---------------------------------------------

def _terminate(dsn: str, application_name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE application_name = %s AND pid <> pg_backend_pid()", (application_name,))
        for _ in range(200):  # the backend exits shortly after the signal
            row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                            (application_name,)).fetchone()
            if row == (0,):
                return
            time.sleep(0.01)
    raise AssertionError("backend did not exit")


def test_terminated_connection_before_the_record_is_retried_on_a_fresh_one(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    victim = psycopg.conninfo.make_conninfo(dsn, application_name="rs_victim")
    calls = []

    def tool() -> dict[str, int]:
        calls.append(1)
        _terminate(dsn, "rs_victim")
        return {"charged": 1}

    with Ledger(victim, tenant_id="t1", worker_id="w1") as led, caplog.at_level(logging.WARNING):
        ex = led.run("charge", tool, {}, key="k")
    assert (ex.status, ex.outcome, ex.result) == ("succeeded", "recorded", {"charged": 1})
    # The connection died while idle: noticed before the record was sent, so the record
    # went out on a fresh connection at once, with nothing to retry.
    assert "retrying on a fresh connection" not in caplog.text
    assert action_row(dsn, "k")["state"] == "succeeded"
    assert len(attempt_rows(dsn, "k")) == 1 and len(calls) == 1


def test_unrecordable_outcome_raises_and_the_action_ends_unknown_never_rerun(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    victim = psycopg.conninfo.make_conninfo(dsn, application_name="rs_victim")
    calls = []

    def tool() -> str:
        calls.append(1)
        _terminate(dsn, "rs_victim")
        return "charged"

    conn = psycopg.connect(victim, autocommit=True)  # a single given connection cannot reconnect
    led = Ledger(conn, tenant_id="t1", worker_id="w1")
    with caplog.at_level(logging.ERROR), pytest.raises(OutcomeNotRecorded) as info:
        led.run("charge", tool, {}, key="k", lease=0.5)
    assert info.value.execution.result == "charged"
    assert "could not record the outcome" in caplog.text and "'k'" in caplog.text
    led.close()
    conn.close()
    with Ledger(dsn, tenant_id="t1", worker_id="w2") as other:
        ex = other.run("charge", tool, {}, key="k", wait_timeout=5)  # waits out the lease
    assert (ex.status, ex.replay) == ("unknown", True)
    assert len(calls) == 1


# --- keys ------------------------------------------------------------------------------

def test_tool_call_key_works_as_an_action_key(led: Ledger) -> None:
    key = keys.tool_call_key("thread-1", "msg-2", "call_3")
    assert led.run("t", Tool(), {}, key=key).status == "succeeded"
    assert led.run("t", Tool(), {}, key=key).replay is True


# --- tracing ---------------------------------------------------------------------------

def test_a_span_per_run_names_the_tool_and_never_the_action_key(led: Ledger) -> None:
    """Through the global tracer provider (tests/driver/test_otel_spans.py covers the rest):
    the action key, which may hold customer data, is in no attribute."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    from opentelemetry import trace

    exporter = memory.InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another test set the process's tracer provider first")
    led.run("refund", Tool(), {}, key="secret-order-42")
    led.run("refund", Tool(), {}, key="secret-order-42")
    spans = exporter.get_finished_spans()
    assert [s.attributes["replaysafe.replay"] for s in spans] == [False, True]
    attrs = dict(spans[0].attributes)
    assert attrs["gen_ai.tool.name"] == "refund" and attrs["replaysafe.outcome"] == "succeeded"
    assert attrs["gen_ai.tool.call.id"].startswith("rs2_")
    assert not any("secret-order-42" in str(v) for s in spans for v in s.attributes.values())


def test_run_with_a_pool_waits_heartbeats_and_returns_connections_clean(dsn: str) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(dsn, min_size=1, max_size=4, open=True) as pool:
        owner = Ledger(pool, tenant_id="t1", worker_id="o")
        waiter = Ledger(pool, tenant_id="t1", worker_id="w")
        out: list[Execution] = []
        import threading
        waiting = threading.Thread(target=lambda: out.append(
            waiter.run("p", Tool(), {}, key="k", wait_timeout=5)))

        def tool() -> str:
            waiting.start()
            time.sleep(0.6)  # two heartbeats (lease 0.6 s) through pooled connections
            return "pooled"

        ex = owner.run("p", tool, {}, key="k", lease=0.6)
        assert (ex.status, ex.outcome, ex.lease_lost) == ("succeeded", "recorded", False)
        waiting.join(timeout=10)
        assert (out[0].status, out[0].result, out[0].replay) == ("succeeded", "pooled", True)
        with pool.connection() as c:
            assert c.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        owner.close()
        waiter.close()
