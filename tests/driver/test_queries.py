"""The driver sends ``p_now`` only when the caller passes a ``now`` (docs/sql-ledger.md):
otherwise the argument is left out, so the function's default — the moment of the call —
applies, not the start of the caller's transaction and not a client clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from replaysafe_pg import queries


def _claim_params(key: str, lease: timedelta) -> dict[str, Any]:
    return {"tenant_id": "t1", "action_key": key, "operation": "op", "request": "{}",
            "worker_id": "w", "lease": lease, "thread_id": None, "on_expired": "unknown",
            "now": None, "claim_token": None}


# With the 0002 default now(), the lease was counted from the transaction's start.
def test_without_now_the_time_is_the_moment_of_the_call(dsn: str) -> None:
    """Inside a transaction that began 1.5 s before the call, a 2 s lease ends at least
    3.5 s after the transaction's start: the function read the clock at the call, which
    no default of now() (the transaction's start) can produce."""
    lease = timedelta(seconds=2)
    with psycopg.connect(dsn) as conn:  # not autocommit: the SELECT opens a transaction
        conn.execute("SELECT pg_sleep(1.5)")
        params = _claim_params("k", lease)
        claim = conn.execute(queries.get("claim_action", params), params).fetchone()
        conn.execute("SELECT pg_sleep(1)")
        assert claim is not None
        beat = {"tenant_id": "t1", "action_key": "k", "attempt": 1, "attempt_token": claim[8],
                "lease": lease, "now": None}
        extended = conn.execute(queries.get("heartbeat_action", beat), beat).fetchone()
        row = conn.execute("SELECT now()").fetchone()
        conn.rollback()
    assert claim is not None and extended is not None and row is not None
    started: datetime = row[0]
    assert claim[0] == "claimed"
    assert claim[3] - started > timedelta(seconds=3), "claim: lease counted from now()"
    assert extended[0] - started > timedelta(seconds=4), "heartbeat: lease counted from now()"
