"""The driver sends ``p_now`` only when the caller passes a ``now`` (SPEC §2, STYLE 7):
otherwise the argument is left out, so the function's default — the moment of the call —
applies, not the start of the caller's transaction and not a client clock."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from replaysafe_pg import queries

TIMED = {"claim_action", "claim_actions", "heartbeat_action", "complete_action", "fail_action",
         "mark_action_unknown", "resolve_action", "sweep_expired_actions", "purge_actions"}
NOW_WORD = re.compile(r"\b(p_now|now)\b")
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_time_sensitive_queries_pass_p_now_in_one_form_only() -> None:
    for name, query in queries.all_queries().items():
        if NOW_WORD.search(query):
            assert query.count(queries.NOW_ARGUMENT) == 1, name
            assert not NOW_WORD.search(query.replace(queries.NOW_ARGUMENT, "")), name
    assert {n for n in queries.all_queries() if queries.takes_now(n)} == TIMED


@pytest.mark.parametrize("name", sorted(TIMED))
def test_every_query_with_p_now_has_a_variant_without_it(name: str) -> None:
    given = queries.get(name, {"now": T0})
    assert queries.NOW_ARGUMENT in given
    for params in (None, {}, {"now": None}, {"tenant_id": "t", "now": None}):
        defaulted = queries.get(name, params)
        assert not NOW_WORD.search(defaulted), (params, defaulted)
        assert defaulted == given.replace(queries.NOW_ARGUMENT, "")


def test_queries_without_time_are_the_same_whatever_the_params() -> None:
    for name in set(queries.all_queries()) - TIMED:
        assert queries.get(name) == queries.get(name, {"now": T0}) == queries.all_queries()[name]


def test_a_query_passing_the_time_another_way_is_refused() -> None:
    with pytest.raises(ValueError, match="p_now"):
        queries.without_now("SELECT f(p_now => coalesce(%(now)s::timestamptz, now()))")


def _claim_params(key: str, lease: timedelta) -> dict[str, Any]:
    return {"tenant_id": "t1", "action_key": key, "operation": "op", "request": "{}",
            "worker_id": "w", "lease": lease, "thread_id": None, "on_expired": "unknown",
            "now": None}


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
        beat = {"tenant_id": "t1", "action_key": "k", "attempt": 1, "lease": lease, "now": None}
        extended = conn.execute(queries.get("heartbeat_action", beat), beat).fetchone()
        row = conn.execute("SELECT now()").fetchone()
        conn.rollback()
    assert claim is not None and extended is not None and row is not None
    started: datetime = row[0]
    assert claim[0] == "claimed"
    assert claim[3] - started > timedelta(seconds=3), "claim: lease counted from now()"
    assert extended[0] - started > timedelta(seconds=4), "heartbeat: lease counted from now()"
