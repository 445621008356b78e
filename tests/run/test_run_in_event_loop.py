"""``Ledger.run`` and ``Ledger.run_many`` (the sync facade) called inside a running event loop
are refused at once, pointing to ``AsyncLedger``, instead of blocking the loop."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from replaysafe_pg import InvalidArgument, Ledger


def _actions(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM replaysafe.actions").fetchone()
    assert row is not None
    return int(row[0])


def test_sync_run_inside_a_running_event_loop_is_refused_not_blocking(dsn: str) -> None:
    """Inside a running loop, run and run_many raise InvalidArgument naming AsyncLedger's
    method, run no tool and write no action; outside a loop run works as before."""
    calls: list[Any] = []

    async def agent() -> None:
        with Ledger(dsn, tenant_id="t1") as led:
            with pytest.raises(InvalidArgument, match=r"use AsyncLedger\.run \(await it\)"):
                led.run("refund", lambda: calls.append(1), {}, key="k")
            with pytest.raises(InvalidArgument, match=r"use AsyncLedger\.run_many"):
                led.run_many([("refund", lambda: calls.append(1), {}, "k2")])

    asyncio.run(agent())
    assert calls == [] and _actions(dsn) == 0
    # Outside a loop (or in a worker thread of one) it runs as before.
    with Ledger(dsn, tenant_id="t1") as led:
        assert led.run("refund", lambda: 7, {}, key="k").result == 7
