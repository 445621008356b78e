"""Two tenants, A and B, seeded by the schema owner for the isolation tests (tests/sql): the
plain seed (``seed_tenants``: a finished action, a live lease and a thread each, the live
attempts' tokens kept in ``TOKENS``) and the claimed one (``seed_claimed_tenants``: a live
claim whose claim token only its claimer knows, and every kind of action a sweep or a
purge meets). The fixtures over them: ``seeded_world`` (tests/sql/isolation/conftest.py)
and ``claimed_world`` (tests/sql/conftest.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from helpers.db import owner_rows

Conn = psycopg.Connection[Any]


# The audit views, each showing its caller's tenant.
VIEWS = ("actions_v", "action_attempts_v", "unresolved_actions", "multi_effect_actions",
         "threads_v")


# The attempt tokens of the seeded claims, by (tenant, action key): every world seeds anew.
TOKENS: dict[tuple[str, str], str] = {}


def token_of(row: tuple[Any, ...] | None) -> str:
    """The attempt token of a claim's answer (``... attempt_token FROM claim_action(...)``:
    its last column)."""
    assert row is not None and row[-1] is not None, row
    token: str = row[-1]
    return token


def seed_tenants(dsn: str) -> None:
    """Per tenant A and B: a succeeded action 'done', a live 1-hour lease 'live' (its attempt
    token in ``TOKENS[tenant, "live"]``) and alice's thread 'mine'."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for tenant in ("A", "B"):
            done = token_of(c.execute(
                "SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => %s, "
                "p_action_key => 'done', p_operation => 'refund', p_request => '{}', "
                "p_worker_id => 'w')", (tenant,)).fetchone())
            c.execute("SELECT replaysafe.complete_action(p_tenant_id => %s, p_action_key => 'done', "
                      "p_attempt => 1, p_attempt_token => %s, p_result => '{\"ok\": true}')",
                      (tenant, done))
            TOKENS[tenant, "live"] = token_of(c.execute(
                "SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => %s, "
                "p_action_key => 'live', p_operation => 'refund', p_request => '{}', "
                "p_worker_id => 'w', p_lease => '1 hour')", (tenant,)).fetchone())
            c.execute("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => 'mine', "
                      "p_expected_version => 0, p_state => '{\"n\": 1}', p_user_id => 'alice')",
                      (tenant,))


# --- the claimed world: a live claim with a claim token ---------------------------------------

CLAIM = ("SELECT outcome, attempt, attempt_token FROM replaysafe.claim_action(p_tenant_id => %(tenant)s, "
         "p_action_key => %(key)s, p_operation => 'refund', p_request => '{}', "
         "p_worker_id => %(worker)s, p_lease => %(lease)s::interval, "
         "p_claim_token => %(token)s::text)")


def secret_of(tenant: str) -> str:
    """The claim token of a tenant's live claim (claim tokens are 22 characters or more)."""
    return f"secret-claim-token-of-tenant-{tenant}"


def seed_claimed_tenants(dsn: str) -> None:
    """Tenants A and B, each with a live claim (token known only to its claimer), a finished
    action, an expired lease, an old finished action, a multi-effect action and a thread."""
    old = datetime.now(UTC) - timedelta(days=30)
    claim_sql = ("SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => %s, "
                 "p_action_key => %s, p_operation => 'refund', p_request => '{}', p_worker_id => 'w', "
                 "p_lease => %s::interval, p_on_expired => %s, "
                 "p_now => coalesce(%s::timestamptz, clock_timestamp()))")
    complete_sql = ("SELECT replaysafe.complete_action(p_tenant_id => %s, p_action_key => %s, "
                    "p_attempt => %s, p_attempt_token => %s, p_result => '{}', "
                    "p_now => coalesce(%s::timestamptz, clock_timestamp()))")

    def claim_at(c: Conn, t: str, key: str, *, lease: str = "30 seconds",
                 on_expired: str = "unknown", now: datetime | None = None) -> str:
        return token_of(c.execute(claim_sql, (t, key, lease, on_expired, now)).fetchone())

    with psycopg.connect(dsn, autocommit=True) as c:
        for t in ("A", "B"):
            c.execute(CLAIM.encode(), {"tenant": t, "key": "live", "worker": "w", "lease": "1 hour",
                                       "token": secret_of(t)})
            done = claim_at(c, t, "done")
            c.execute(complete_sql, (t, "done", 1, done, None))
            claim_at(c, t, "expired", lease="1 minute", now=old)
            c.execute(complete_sql, (t, "old", 1, claim_at(c, t, "old", now=old), old))
            # Two successful attempts: attempt 1's lease expires (reclaim), attempt 2 claims.
            first = claim_at(c, t, "multi", lease="1 minute", on_expired="reclaim", now=old)
            second = claim_at(c, t, "multi", on_expired="reclaim")
            for attempt, token in ((2, second), (1, first)):
                c.execute(complete_sql, (t, "multi", attempt, token, None))
            c.execute("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => 'mine', "
                      "p_expected_version => 0, p_state => '{\"n\": 1}', p_user_id => 'alice')", (t,))


def b_rows(dsn: str) -> list[tuple[Any, ...]]:
    """Tenant B's actions (key, state, attempt, result), read as the owner."""
    return owner_rows(dsn, "SELECT action_key, state::text, attempt, result FROM replaysafe.actions "
                           "WHERE tenant_id = 'B' ORDER BY 1")
