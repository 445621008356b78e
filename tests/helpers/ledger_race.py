"""Helpers for the ledger race tests: scripted interleavings on real connections.

Blocking is detected with ``pg_blocking_pids()`` (never by sleeping and hoping), and every
state transition is counted by a test-only trigger, so "exactly one transition" is asserted
from what the database did rather than inferred from the final row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

CLAIM_SQL = ("SELECT outcome, attempt, attempt_token FROM replaysafe.claim_action("
             "p_tenant_id => 't1', p_action_key => %(key)s, p_operation => 'refund', "
             "p_request => '{\"order\": 42}', p_worker_id => %(worker)s, "
             "p_lease => '30 seconds', p_on_expired => %(policy)s, p_now => %(now)s)")


def claim_with_token(conn: psycopg.Connection[Any], key: str, now: Any, *, worker: str = "w",
                     policy: str = "unknown") -> tuple[str, int, str | None]:
    """The claim's outcome, attempt and attempt token (set only when it is "claimed")."""
    row = conn.execute(CLAIM_SQL, {"key": key, "worker": worker, "policy": policy,
                                   "now": now}).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def claim_sql(conn: psycopg.Connection[Any], key: str, now: Any, *, worker: str = "w",
              policy: str = "unknown") -> tuple[str, int]:
    outcome, attempt, _ = claim_with_token(conn, key, now, worker=worker, policy=policy)
    return outcome, attempt


def install_transition_log(conn: psycopg.Connection[Any]) -> None:
    """Record every UPDATE of an action's state/attempt, and every attempt row updated or
    inserted with an outcome (a first attempt's row is written when it closes) (test only)."""
    conn.execute("""
        CREATE TABLE public.transitions (
            seq serial PRIMARY KEY, tbl text, action_key text, attempt int,
            old_state text, new_state text, old_attempt int);
        CREATE FUNCTION public.log_action() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF OLD.state IS DISTINCT FROM NEW.state OR OLD.attempt IS DISTINCT FROM NEW.attempt THEN
                INSERT INTO public.transitions (tbl, action_key, attempt, old_state, new_state,
                                                old_attempt)
                VALUES ('actions', NEW.action_key, NEW.attempt, OLD.state, NEW.state, OLD.attempt);
            END IF;
            RETURN NEW;
        END $$;
        CREATE FUNCTION public.log_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'UPDATE' OR NEW.outcome IS NOT NULL THEN
                INSERT INTO public.transitions (tbl, action_key, attempt, old_state, new_state)
                VALUES ('attempts', NEW.action_key, NEW.attempt, OLD.outcome, NEW.outcome);
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER log_action AFTER UPDATE ON replaysafe.actions
            FOR EACH ROW EXECUTE FUNCTION public.log_action();
        CREATE TRIGGER log_attempt AFTER INSERT OR UPDATE ON replaysafe.action_attempts
            FOR EACH ROW EXECUTE FUNCTION public.log_attempt();
    """)


def transitions(conn: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT action_key, attempt, old_state, new_state FROM public.transitions "
        "WHERE tbl = %s ORDER BY seq", (table,)).fetchall()


def wait_until_blocked(observer: psycopg.Connection[Any], waiter_pid: int, holder_pid: int,
                       timeout: float = 10.0) -> None:
    """Return once ``waiter_pid`` waits for a lock held by ``holder_pid`` (else fail)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = observer.execute("SELECT pg_blocking_pids(%s)", (waiter_pid,)).fetchone()
        if row is not None and holder_pid in row[0]:
            return
        time.sleep(0.005)  # polling a condition, not synchronising by sleep
    raise AssertionError(f"backend {waiter_pid} never blocked on {holder_pid}")


class Background:
    """Run one call in a thread; ``result()`` joins it and re-raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # handed back to the test thread
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 10.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background call did not finish"
        if self._error is not None:
            raise self._error
        return self._value


def process_claim(dsn: str, key: str, now: Any, barrier: Any, out: Any) -> None:
    """Body of one claiming process (multiprocessing spawn target)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        barrier.wait(timeout=60)
        out.put(claim_sql(conn, key, now, worker=f"p{id(conn)}"))


def run_together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Start every call in its own thread behind one barrier; results in call order."""
    barrier = threading.Barrier(len(calls))

    def gated(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            barrier.wait(timeout=30)
            return fn()
        return run

    running = [Background(gated(fn)) for fn in calls]
    return [r.result(60) for r in running]
