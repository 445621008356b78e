"""docs/isolation.md: times and ids a caller passes are bounded. A lease or a p_now out of range
is refused even for the schema owner; a worker cannot move time (beyond a few minutes of the
clock) to take or end a live lease; a lease starts at the call; ids are bounded in bytes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers.db import owner_rows, sqlstate
from helpers.seeded_tenants import TOKENS

Conn = psycopg.Connection[Any]


@pytest.mark.parametrize("args", [
    "p_lease => 'infinity'", "p_lease => '100000 years'", "p_lease => '8 days'",
    "p_lease => '1 month -23 days'",
    "p_lease => '-1 second'", "p_now => 'infinity'", "p_now => '-infinity'",
    "p_now => '4713-01-01 BC'", "p_now => NULL",
])
def test_times_out_of_range_are_refused_even_for_the_owner(dsn: str, args: str) -> None:
    """Times out of range are refused even for the owner."""
    with psycopg.connect(dsn, autocommit=True) as c:
        # An infinite interval exists from Postgres 17; before, the literal itself is refused.
        old = "infinity'" in args and "p_lease" in args and c.info.server_version < 170000
        assert sqlstate(c, "SELECT replaysafe.claim_action(p_tenant_id => 't', p_action_key => 'k', "
                           f"p_operation => 'op', p_request => '{{}}', p_worker_id => 'w', {args})"
                        ) == ("22007" if old else "RS005")
        assert c.execute("SELECT count(*) FROM replaysafe.actions").fetchone() == (0,)


def test_a_worker_cannot_move_time(seeded_world: str, worker_a: Conn) -> None:
    """A worker cannot move time."""
    far = datetime.now(UTC) + timedelta(hours=2)
    # The attempt's own token: the refusal is the time's.
    params = {"now": far, "token": TOKENS["A", "live"]}
    for call in (
            "replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'live', "
            "p_operation => 'refund', p_request => '{}', p_worker_id => 'w', p_now => %(now)s)",
            "replaysafe.sweep_expired_actions(p_now => %(now)s)",
            "replaysafe.heartbeat_action(p_tenant_id => 'A', p_action_key => 'live', "
            "p_attempt => 1, p_attempt_token => %(token)s, p_now => %(now)s)",
            "replaysafe.complete_action(p_tenant_id => 'A', p_action_key => 'live', "
            "p_attempt => 1, p_attempt_token => %(token)s, p_result => '{}', p_now => %(now)s)"):
        assert sqlstate(worker_a, f"SELECT {call}", params) == "RS005", call
    # The live lease is untouched; within 5 minutes of the clock is fine.
    assert owner_rows(seeded_world, "SELECT state::text FROM replaysafe.actions "
                                    "WHERE tenant_id = 'A' AND action_key = 'live'") == [("running",)]
    near = datetime.now(UTC) + timedelta(minutes=1)
    assert worker_a.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                            (near,)).fetchone() == (0,)


def test_a_lease_starts_at_the_call_not_at_the_transaction_start(dsn: str) -> None:
    """A lease starts at the call not at the transaction start."""
    with psycopg.connect(dsn) as c:  # a transaction, opened before the claim
        c.execute("SELECT pg_sleep(1.5)")
        row = c.execute("SELECT lease_expires_at, lease_expires_at > clock_timestamp() "
                        "FROM replaysafe.claim_action(p_tenant_id => 't', p_action_key => 'k', "
                        "p_operation => 'op', p_request => '{}', p_worker_id => 'w', "
                        "p_lease => '1 second')").fetchone()
        assert row is not None and row[1] is True  # not expired at birth
        c.commit()


def test_ids_are_bounded_in_bytes_too(dsn: str) -> None:
    """Ids are bounded in bytes too."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for key in ("界" * 512, "界" * 342):  # 1,536 and 1,026 bytes
            assert sqlstate(c, "SELECT replaysafe.claim_action(p_tenant_id => 't', p_action_key => %s, "
                               "p_operation => 'op', p_request => '{}', p_worker_id => 'w')",
                            (key,)) == "RS005"
        ok = "界" * 341  # 1,023 bytes
        c.execute("SELECT replaysafe.claim_action(p_tenant_id => 't', p_action_key => %s, "
                  "p_operation => 'op', p_request => '{}', p_worker_id => 'w')", (ok,))
        assert c.execute("SELECT count(*) FROM replaysafe.actions").fetchone() == (1,)


def test_a_workers_future_time_cannot_take_a_live_lease(seeded_world: str, worker_a: Conn) -> None:
    """A workers future time cannot take a live lease."""
    honest = worker_a.execute(
        "SELECT outcome, attempt, attempt_token FROM replaysafe.claim_action(p_tenant_id => 'A', "
        "p_action_key => 'pay', p_operation => 'pay', p_request => '{}', p_worker_id => 'honest', "
        "p_on_expired => 'reclaim')").fetchone()
    assert honest is not None and honest[:2] == ("claimed", 1)
    soon = datetime.now(UTC) + timedelta(minutes=4, seconds=59)  # inside the 5-minute window
    hostile = worker_a.execute(
        "SELECT outcome, attempt FROM replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'pay', "
        "p_operation => 'pay', p_request => '{}', p_worker_id => 'hostile', "
        "p_on_expired => 'reclaim', p_now => %s)", (soon,)).fetchone()
    assert hostile == ("running", 1)
    assert worker_a.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                            (soon,)).fetchone() == (0,)
    # the honest worker still holds it
    worker_a.execute("SELECT replaysafe.heartbeat_action(p_tenant_id => 'A', p_action_key => 'pay', "
                     "p_attempt => 1, p_attempt_token => %s)", (honest[2],))
