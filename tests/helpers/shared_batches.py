"""Actions of several tenants written as the schema owner (who may pass any p_now: leases
that ran out and actions finished a while ago, in bulk), and read back as the owner: the
batches an all-tenant sweep or purge shares between tenants (tests/sql/isolation:
test_all_tenant_bindings.py, test_shared_sweep_and_purge.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg

from helpers.db import owner_rows

Conn = psycopg.Connection[Any]


CLAIM = ("SELECT outcome, attempt, attempt_token FROM replaysafe.claim_action("
         "p_tenant_id => %(t)s, p_action_key => %(k)s, p_operation => 'refund', "
         "p_request => '{}', p_worker_id => 'w', p_lease => %(lease)s::interval, "
         "p_on_expired => %(on_expired)s, p_now => clock_timestamp() - %(ago)s::interval)")


COMPLETE = ("SELECT replaysafe.complete_action(p_tenant_id => %(t)s, p_action_key => %(k)s, "
            "p_attempt => %(attempt)s, p_attempt_token => %(token)s, p_result => '{}', "
            "p_now => clock_timestamp() - %(ago)s::interval)")


def claim(c: Conn, tenant: str, key: str, *, lease: str = "1 hour", ago: str = "0",
          on_expired: str = "unknown") -> tuple[int, str]:
    """A claim that must answer ``claimed``: its attempt and attempt token."""
    row = c.execute(CLAIM, {"t": tenant, "k": key, "lease": lease, "ago": ago,
                            "on_expired": on_expired}).fetchone()
    assert row is not None and row[0] == "claimed", row
    return int(row[1]), str(row[2])


def complete(c: Conn, tenant: str, key: str, attempt: int, token: str, *,
             ago: str = "0") -> str:
    row = c.execute(COMPLETE, {"t": tenant, "k": key, "attempt": attempt, "token": token,
                               "ago": ago}).fetchone()
    assert row is not None
    return str(row[0])


def expired_leases(c: Conn, tenant: str, n: int, *, ago: str, prefix: str = "lease") -> None:
    """``n`` running actions of ``tenant`` whose 1-second leases ran out ``ago``."""
    row = c.execute(
        "SELECT count(*) FROM generate_series(1, %(n)s) g, LATERAL replaysafe.claim_action("
        "p_tenant_id => %(t)s, p_action_key => %(p)s || '_' || g, p_operation => 'refund', "
        "p_request => '{}', p_worker_id => 'w', p_lease => '1 second', "
        "p_now => clock_timestamp() - %(ago)s::interval) cl WHERE cl.outcome = 'claimed'",
        {"n": n, "t": tenant, "p": prefix, "ago": ago}).fetchone()
    assert row == (n,)


def finished_actions(c: Conn, tenant: str, n: int, *, ago: str, prefix: str = "done") -> None:
    """``n`` succeeded actions of ``tenant``, completed ``ago``."""
    row = c.execute(
        "SELECT count(*) FROM generate_series(1, %(n)s) g, LATERAL replaysafe.claim_action("
        "p_tenant_id => %(t)s, p_action_key => %(p)s || '_' || g, p_operation => 'refund', "
        "p_request => '{}', p_worker_id => 'w', p_lease => '1 hour', "
        "p_now => clock_timestamp() - %(ago)s::interval) cl, LATERAL replaysafe.complete_action("
        "p_tenant_id => %(t)s, p_action_key => %(p)s || '_' || g, p_attempt => cl.attempt, "
        "p_attempt_token => cl.attempt_token, p_result => '{}', "
        "p_now => clock_timestamp() - %(ago)s::interval) r(outcome) WHERE r.outcome = 'recorded'",
        {"n": n, "t": tenant, "p": prefix, "ago": ago}).fetchone()
    assert row == (n,)


def states(dsn: str) -> Counter[tuple[str, str]]:
    """(tenant, state) -> number of actions, read as the owner."""
    return Counter({(t, s): n for t, s, n in owner_rows(
        dsn, "SELECT tenant_id, state::text, count(*) FROM replaysafe.actions GROUP BY 1, 2")})


def state_of(dsn: str, tenant: str, key: str) -> str | None:
    rows = owner_rows(dsn, "SELECT state::text FROM replaysafe.actions "
                           "WHERE tenant_id = %s AND action_key = %s", (tenant, key))
    return rows[0][0] if rows else None


def one(c: Conn, query: str, params: Any = None) -> Any:
    row = c.execute(query.encode(), params).fetchone()
    assert row is not None
    return row[0]


SWEEP = "SELECT replaysafe.sweep_expired_actions(p_limit => %s)"


PURGE = "SELECT replaysafe.purge_actions(p_older_than => '0', p_limit => %s)"
