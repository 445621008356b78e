"""Claim tokens (SPEC §2) are secrets: the database keeps only their sha256, no role reads them,
they are not in a peer's pg_stat_activity, a token matches only its own live attempt and
only while its lease runs, and claim_actions lines tokens up with keys by position. Tried with
real LOGIN roles: a worker, an operator or an auditor of tenant A, or a colleague sharing
its login."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.claim_tokens import claim_as
from helpers.db import bind, connect_as, owner_rows, sqlstate
from helpers.seeded_tenants import CLAIM, b_rows, secret_of
from psycopg import conninfo as pg_conninfo

import replaysafe_pg

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


def claim(c: Conn, key: str, token: str | None, *, tenant: str = "A", worker: str = "w",
          lease: str = "1 hour") -> tuple[Any, ...]:
    row = c.execute(CLAIM.encode(), {"tenant": tenant, "key": key, "worker": worker,
                                     "lease": lease, "token": token}).fetchone()
    assert row is not None
    return tuple(row)


CLAIM_MANY = ("SELECT outcome FROM replaysafe.claim_actions(p_tenant_id => 'A', "
              "p_action_keys => '{ka,kb}', p_operations => '{refund,refund}', "
              "p_requests => '{\"{}\",\"{}\"}'::jsonb[], p_worker_id => 'w', "
              "p_claim_tokens => %s::text[])")


# Tokens long enough to be taken (22 characters or more), so that only their lining up is
# refused; the ids are the arrays' shapes.
@pytest.mark.parametrize("tokens", [
    pytest.param(shape.replace("tok-", "claim-token-of-key-"), id=shape)
    for shape in ("[0:1]={tok-a,tok-b}", "[2:3]={tok-a,tok-b}", "{{tok-a},{tok-b}}")])
@pytest.mark.usefixtures("claimed_world")
def test_claim_actions_refuses_tokens_that_do_not_line_up(worker_a: Conn,
                                                                  tokens: str) -> None:
    """One token per key, by position (SPEC §2): an array with another lower bound or two
    dimensions passes the cardinality check, then `p_claim_tokens[i]` gives key 1 the token
    of key 2 (or NULL). Nothing is gained by an attacker, but the claim is recorded under a
    token its caller never gave that key: RS005 is the answer the SPEC asks for.

    claim_actions
    lines tokens up by subscript, not by position."""
    state = sqlstate(worker_a, CLAIM_MANY, (tokens,))
    kept = worker_a.execute(b"SELECT count(*) FROM replaysafe.actions_v "
                            b"WHERE action_key IN ('ka', 'kb')").fetchone()
    assert (state, kept) == ("RS005", (0,))


def test_no_role_can_read_a_claim_token(claimed_world: str, make_role: MakeRole) -> None:
    """The database keeps only the tokens' sha256, on replaysafe.actions (the claim token's and
    the attempt token's) and replaysafe.action_attempts (the attempt token's), and
    installation.token_secret derives attempt tokens; the views list their columns, so none
    shows any of them, and no group role holds a privilege on those columns or on
    _visible_actions."""
    hashes = owner_rows(claimed_world, """
        SELECT c.relname::text, a.attname::text FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind = 'r'
          AND a.attname LIKE '%token%' ORDER BY 1, 2""")
    assert hashes == [("action_attempts", "attempt_token_hash"), ("actions", "attempt_token_hash"),
                      ("actions", "claim_token_hash"), ("installation", "token_secret")], hashes
    for group in ("replaysafe_worker", "replaysafe_operator", "replaysafe_auditor"):
        rows = owner_rows(claimed_world, """
            SELECT c.relname::text, a.attname::text FROM pg_class c
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            WHERE c.relnamespace = 'replaysafe'::regnamespace
              AND has_column_privilege(%s, c.oid, a.attnum, 'SELECT')
              AND a.attname LIKE '%%token%%'""", (group,))
        assert rows == [], (group, rows)
    auditor = make_role("replaysafe_auditor")  # unbound: reads every tenant
    with connect_as(claimed_world, auditor) as c:
        everything = json.dumps([c.execute(f"SELECT * FROM replaysafe.{v}".encode()).fetchall()
                                 for v in ("actions_v", "action_attempts_v", "unresolved_actions",
                                           "multi_effect_actions")], default=str)
        assert "secret-claim-token-of-" not in everything
        columns = [d.name for v in ("actions_v", "action_attempts_v")
                   for d in c.execute(f"SELECT * FROM replaysafe.{v}".encode()).description or []]
        assert columns and not [n for n in columns if "token" in n], columns
        assert sqlstate(c, "SELECT claim_token_hash FROM replaysafe._visible_actions") == "42501"


def test_a_token_matches_only_its_own_live_attempt(claimed_world: str, worker_a: Conn,
                                                   make_role: MakeRole) -> None:
    """A token matches only its own live attempt."""
    peer = make_role("replaysafe_worker")  # another worker of tenant A
    bind(claimed_world, peer, "A")
    with connect_as(claimed_world, peer) as c:
        for token in (None, secret_of("B"), secret_of("A").upper(), secret_of("A") + " ",
                      secret_of("")):
            assert claim(c, "live", token)[0] == "running", token
        # B's own token, for B's key, from A: refused before any row is read.
        assert sqlstate(c, CLAIM, {"tenant": "B", "key": "live", "worker": "w",
                                   "lease": "1 hour", "token": secret_of("B")}) == "RS004"
        # A claim token of fewer than 22 characters is refused, never compared.
        assert sqlstate(c, CLAIM, {"tenant": "A", "key": "live", "worker": "w",
                                   "lease": "1 hour", "token": secret_of("A")[:21]}) == "RS005"
        # The token of A's 'live' does not match A's other keys.
        assert claim(c, "done", secret_of("A"))[0] == "replay"
        assert claim(c, "multi", secret_of("A"))[0] == "replay"
    # A claim without a token never matches an attempt claimed without one (NULL = NULL).
    assert claim(worker_a, "untokened", None)[0] == "claimed"
    assert claim(worker_a, "untokened", None)[0] == "running"
    assert b_rows(claimed_world)[2][:3] == ("live", "running", 1)


def test_a_token_is_not_in_a_peers_pg_stat_activity(claimed_world: str, make_role: MakeRole) -> None:
    """Workers of a tenant often share one login (docs/isolation.md's how-to), and
    pg_stat_activity shows a session's query to its own role. The driver sends the token as a
    bound parameter: a peer sees `$10`, never the token."""
    login = make_role("replaysafe_worker")
    bind(claimed_world, login, "A")
    token = "tok-" + uuid.uuid4().hex
    blocker = psycopg.connect(claimed_world)  # the owner holds A's row, so the claim waits in flight
    blocker.execute("SELECT 1 FROM replaysafe.actions WHERE tenant_id = 'A' "
                    "AND action_key = 'live' FOR UPDATE")
    role_dsn = pg_conninfo.make_conninfo(claimed_world, user=login)
    done: list[Any] = []

    def claimer() -> None:
        with replaysafe_pg.Ledger(role_dsn, tenant_id="A", worker_id="w1") as led:
            done.append(led.claim("live", "refund", {}, claim_token=token))

    t = threading.Thread(target=claimer)
    t.start()
    try:
        with connect_as(claimed_world, login) as peer:
            seen = ""
            for _ in range(100):
                rows = peer.execute("SELECT query FROM pg_stat_activity WHERE usename = "
                                    "current_user AND pid <> pg_backend_pid() "
                                    "AND query LIKE '%claim_action%'").fetchall()
                if rows:
                    seen = rows[0][0]
                    break
                time.sleep(0.05)
        assert "claim_action" in seen and token not in seen, seen
    finally:
        blocker.rollback()
        blocker.close()
        t.join(10)
    assert done and done[0].outcome == "running"


@pytest.mark.usefixtures("claimed_world")
def test_a_token_is_not_answered_after_its_lease_expired(worker_a: Conn) -> None:
    """SPEC §2: the token answers "claimed" again only "as long as that lease has not
    expired". A worker may pass a p_now up to 5 minutes in the past, and the token branch
    compares the lease with that p_now: a lease that ran out minutes ago (not yet swept) is
    answered "claimed" again, with a lease_expires_at in the past. (heartbeat_action revives
    such a lease by design; a claim's answer should not.)

    the back-dated claim token."""
    ago = "SELECT clock_timestamp() - interval '%s seconds'"
    start = worker_a.execute((ago % 240).encode()).fetchone()
    replay_at = worker_a.execute((ago % 290).encode()).fetchone()
    assert start is not None and replay_at is not None
    first = worker_a.execute(
        b"SELECT outcome FROM replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'bd', "
        b"p_operation => 'op', p_request => '{}', p_worker_id => 'w', p_lease => '1 minute', "
        b"p_claim_token => 'a-back-dated-claim-token', p_now => %s)", start).fetchone()
    assert first == ("claimed",)  # its lease ran out three minutes ago
    again = worker_a.execute(
        b"SELECT outcome, lease_expires_at < clock_timestamp() FROM replaysafe.claim_action("
        b"p_tenant_id => 'A', p_action_key => 'bd', p_operation => 'op', p_request => '{}', "
        b"p_worker_id => 'w', p_claim_token => 'a-back-dated-claim-token', p_now => %s)",
        replay_at).fetchone()
    assert again is not None and again[0] != "claimed", again


def test_a_claim_token_is_at_least_22_characters_and_kept_only_as_a_hash(
        dsn: str, two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, w2, _listener = two_workers
    for short in ("tok", "t" * 21):
        with pytest.raises(psycopg.Error) as raised:
            claim_as(w1, "k", claim_token=short)
        assert raised.value.sqlstate == "RS005" and "p_claim_token" in str(raised.value)
    secret = "c" * 11 + "0123456789x"
    first = claim_as(w1, "k", worker="w1", claim_token=secret)
    again = claim_as(w1, "k", worker="w1", claim_token=secret)
    assert first[:3] == again[:3] and first[0] == "claimed"  # the lost answer, again
    assert claim_as(w2, "k", worker="w2")[2] is None  # a claim without the token: no capability
    with psycopg.connect(dsn, autocommit=True) as c:
        dump = c.execute("SELECT string_agg(row_to_json(x)::text, '') FROM replaysafe.actions x"
                         ).fetchone()
        views = c.execute(
            "SELECT string_agg(row_to_json(v)::text, '') FROM ("
            "SELECT row_to_json(a)::text FROM replaysafe.actions_v a UNION ALL "
            "SELECT row_to_json(t)::text FROM replaysafe.action_attempts_v t) v").fetchone()
    assert dump is not None and views is not None
    for text in (dump[0], views[0]):
        assert secret not in text and first[2] not in text
