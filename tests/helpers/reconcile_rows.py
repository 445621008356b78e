"""Rows for the reconciliation tests: actions whose outcome was lost, a tenant's worker
holding their rows in a transaction it leaves open, a call that must finish while they are
held, and an action's state as the schema owner reads it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import conninfo as pg_conninfo

from helpers.db import bind
from replaysafe_pg import Ledger
from replaysafe_pg.models import Claim

# Well over a few lock waits (LOCK_WAIT_MS, 0.5 s each).
QUICK = 5.0
T = TypeVar("T")


def unknown(led: Ledger, key: str, request: dict[str, Any] | None = None,
            operation: str = "refund") -> Claim:
    """An action whose outcome was lost: claimed, then marked unknown (the claim holds the
    attempt's token, for a late report)."""
    claim = led.claim(key, operation, request or {"order": key})
    led.mark_unknown(claim, {"reason": "timeout"})
    return claim


@contextlib.contextmanager
def held(dsn: str, worker: str, tenant: str, *claims: Claim) -> Iterator[Callable[[], None]]:
    """The tenant's own worker (a login bound to it) reports late on each claim (a no-op:
    the action stays unknown) in a transaction it leaves open: it holds those actions' rows
    until the end of the block, or until it is handed back the callable it yields."""
    conn = psycopg.connect(pg_conninfo.make_conninfo(dsn, user=worker))

    def release() -> None:
        if not conn.closed:
            conn.rollback()
            conn.close()

    try:
        conn.execute("SELECT 1")  # the transaction is open from here
        with Ledger(conn, tenant_id=tenant) as led:
            for claim in claims:
                assert led.mark_unknown(claim, {"reason": "late"}) == "late"
        yield release
    finally:
        release()


def quickly(release: Callable[[], None], fn: Callable[[], T]) -> T:
    """``fn()``, which must finish within QUICK seconds while the rows are held; if it does
    not, the holder lets go (so that it ends) and the test fails."""
    out: list[T] = []
    raised: list[BaseException] = []

    def call() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=call)
    started = time.monotonic()
    thread.start()
    thread.join(QUICK)
    if thread.is_alive():
        release()
        thread.join(30)
        pytest.fail(f"still waiting after {QUICK} s for rows another transaction holds")
    if raised:
        raise raised[0]
    assert time.monotonic() - started < QUICK
    return out[0]


def workers_of(dsn: str, make_role: Callable[..., str]) -> Callable[[str], str]:
    """What a test's ``worker_of`` fixture gives: a function making, for a tenant, a LOGIN
    role in replaysafe_worker bound to it (``make_role`` drops it after the test)."""
    def make(tenant: str) -> str:
        role = make_role("replaysafe_worker")
        bind(dsn, role, tenant)
        return role
    return make


def state(dsn: str, tenant: str, key: str) -> str:
    """The action's state, read as ``dsn``'s own role."""
    with Ledger(dsn, tenant_id=tenant) as led:
        action = led.get(key)
    assert action is not None
    return action.state.value


# A JSON array of that many numbers with 16,383 decimal places each: about 16 bytes each
# stored (jsonb keeps a number's digits, not its trailing zeros), and compressed much less,
# but 16,385 bytes each as JSON text, which the server prints without a pause: 65,534 of
# them are over its 1 GB limit on a string, no statement can print them (SQLSTATE 54000);
# 30,000 (about 490 MB of text) take seconds to print.
UNPRINTABLE = 65534
SLOW_TO_PRINT = 30000
# Text that does not compress (hex digits of md5), about 4.8 MB: with it, a request is stored
# larger than reconcile's ROW_BYTES.
INCOMPRESSIBLE = ("(SELECT pg_catalog.string_agg(pg_catalog.md5(i::text), '') "
                  "FROM pg_catalog.generate_series(1, 150000) i)")


def unprintable(dsn: str, tenant: str, key: str, *, numbers: int = UNPRINTABLE,
                stored_large: bool = False) -> int:
    """Give the action, as the schema owner (past any size check), a request of ``numbers``
    long numbers: by default, one whose JSON text the server cannot produce;
    ``stored_large``: also stored larger than reconcile's ROW_BYTES (INCOMPRESSIBLE beside
    it). Returns its stored size."""
    extra = f", 'blob', {INCOMPRESSIBLE}" if stored_large else ""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE replaysafe.actions SET request = pg_catalog.jsonb_build_object("
                  "'order', action_key, 'numbers', (SELECT pg_catalog.jsonb_agg("
                  "pg_catalog.round(1::numeric, 16383)) FROM pg_catalog.generate_series(1, %s))"
                  f"{extra}) WHERE tenant_id = %s AND action_key = %s", (numbers, tenant, key))
        row = c.execute("SELECT pg_catalog.pg_column_size(request) FROM replaysafe.actions "
                        "WHERE tenant_id = %s AND action_key = %s", (tenant, key)).fetchone()
    assert row is not None
    return int(row[0])
