"""Claims that carry a claim token (SPEC §2, revision 0005), made by a worker login:
readable tokens of the shortest length taken and the claim itself, by named parameters
(``claim``: the claim token tests of tests/sql/ledger and the collation attacks of
tests/sql/isolation) or positional ones for tenant A (``claim_as``: the two-worker tests of
tests/sql/ledger)."""

from __future__ import annotations

from typing import Any

import psycopg

Conn = psycopg.Connection[Any]


def tok(name: str) -> str:
    """A claim token of the shortest length taken (22 characters), named for the reader."""
    return name.ljust(22, "-")


TOK1, TOK2, TOK9 = tok("tok-1"), tok("tok-2"), tok("tok-9")


CLAIM = ("SELECT outcome, attempt, lease_expires_at, attempt_token FROM replaysafe.claim_action("
         "p_tenant_id => %(tenant)s, p_action_key => %(key)s, p_operation => 'refund', "
         "p_request => '{}', p_worker_id => %(worker)s, p_lease => %(lease)s::interval, "
         "p_on_expired => %(on_expired)s, p_now => %(now)s::timestamptz, "
         "p_claim_token => %(token)s::text)")


def claim(c: Conn, key: str, token: str | None, *, tenant: str = "A", worker: str = "w1",
          lease: str = "30 seconds", on_expired: str = "unknown",
          now: str | None = None) -> tuple[Any, ...]:
    params = {"tenant": tenant, "key": key, "worker": worker, "lease": lease,
              "on_expired": on_expired, "now": now, "token": token}
    query = CLAIM if now is not None else CLAIM.replace(", p_now => %(now)s::timestamptz", "")
    row = c.execute(query.encode(), params).fetchone()
    assert row is not None
    return tuple(row)


CLAIM_AS = ("SELECT outcome, attempt, attempt_token, lease_expires_at FROM replaysafe.claim_action("
            "p_tenant_id => 'A', p_action_key => %s, p_operation => 'refund', p_request => '{}', "
            "p_worker_id => %s, p_lease => %s::interval, p_on_expired => %s, p_claim_token => %s)")


def claim_as(conn: Conn, key: str, *, worker: str = "w", lease: str = "30 seconds",
             on_expired: str = "unknown", claim_token: str | None = None) -> tuple[Any, ...]:
    """A claim of tenant A's ``key`` on ``conn``: (outcome, attempt, attempt_token,
    lease_expires_at)."""
    row = conn.execute(CLAIM_AS, (key, worker, lease, on_expired, claim_token)).fetchone()
    assert row is not None
    return tuple(row)
