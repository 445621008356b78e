"""Claim tokens (SPEC §2, revision 0005): a claim whose answer was lost is asked for again.

Run as real worker logins bound to a tenant. Only a claim repeating the token of the attempt
that is running under a live lease answers ``claimed`` again, with that attempt and lease;
nothing else ever matches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.claim_tokens import TOK1, TOK2, TOK9, claim, tok
from helpers.db import bind, connect_as, sqlstate

Conn = psycopg.Connection[Any]


@pytest.fixture
def worker_b(dsn: str, make_role: Callable[..., str]) -> Iterator[Conn]:
    role = make_role("replaysafe_worker")
    bind(dsn, role, "B")
    with connect_as(dsn, role) as c:
        yield c


def test_the_same_token_gets_the_same_attempt_and_lease_while_it_is_live(worker_a: Conn) -> None:
    first = claim(worker_a, "k", TOK1)
    assert first[0] == "claimed"
    again = claim(worker_a, "k", TOK1)
    # Same attempt, same lease (not extended, not a new attempt), same attempt token.
    assert again == first
    # The answer was given without a new attempt or a waiter.
    rows = worker_a.execute("SELECT attempt, outcome FROM replaysafe.action_attempts_v "
                            "WHERE action_key = 'k'").fetchall()
    assert rows == [(1, None)]


def test_no_other_claim_ever_matches(worker_a: Conn) -> None:
    first = claim(worker_a, "k", TOK1)
    assert first[0] == "claimed"
    assert claim(worker_a, "k", TOK2)[0] == "running"
    assert claim(worker_a, "k", None)[0] == "running"
    # The token of another key's attempt does not match this one.
    assert claim(worker_a, "k2", TOK2)[0] == "claimed"
    assert claim(worker_a, "k", TOK2)[0] == "running"
    # After its report the action replays, whatever the token.
    worker_a.execute("SELECT replaysafe.complete_action(p_tenant_id => 'A', p_action_key => 'k', "
                     "p_attempt => 1, p_attempt_token => %s, p_result => '{}')", (first[3],))
    assert claim(worker_a, "k", TOK1)[0] == "replay"


def test_a_token_never_crosses_tenants(worker_a: Conn, worker_b: Conn) -> None:
    a = claim(worker_a, "k", TOK1)
    assert a[0] == "claimed"
    # Tenant B's action of the same key is its own: B's claim creates it; B repeating A's
    # token for B's action never answers for A's attempt (nor with A's attempt token).
    b = claim(worker_b, "k", TOK1, tenant="B")
    assert b == claim(worker_b, "k", TOK1, tenant="B")
    assert b[3] != a[3]
    assert claim(worker_b, "k", TOK9, tenant="B")[0] == "running"
    # A worker of B cannot claim A's action at all, token or not.
    assert sqlstate(worker_b, "SELECT replaysafe.claim_action(p_tenant_id => 'A', "
                    "p_action_key => 'k', p_operation => 'refund', p_request => '{}', "
                    "p_worker_id => 'w', p_claim_token => %s)", (TOK1,)) == "RS004"


def test_no_match_once_the_lease_has_expired(worker_a: Conn) -> None:
    # Claimed 200 s ago with a 60 s lease (a worker may pass a time of the last 5 minutes).
    old = worker_a.execute("SELECT (clock_timestamp() - interval '200 seconds')::text").fetchone()
    assert old is not None
    assert claim(worker_a, "k", TOK1, lease="60 seconds", now=old[0])[0] == "claimed"
    assert claim(worker_a, "k", TOK1)[0] == "unknown"
    # Under 'reclaim' the expired lease gives a new attempt: never the old one.
    first = claim(worker_a, "r", TOK2, lease="60 seconds", on_expired="reclaim", now=old[0])
    assert first[:2] == ("claimed", 1)
    second = claim(worker_a, "r", TOK2, on_expired="reclaim")
    assert second[:2] == ("claimed", 2)
    assert second[3] != first[3]  # a new attempt, a new attempt token


def test_a_new_attempt_takes_its_own_token(worker_a: Conn) -> None:
    first = claim(worker_a, "k", TOK1)
    assert first[0] == "claimed"
    worker_a.execute("SELECT replaysafe.fail_action(p_tenant_id => 'A', p_action_key => 'k', "
                     "p_attempt => 1, p_attempt_token => %s, p_error => '{}', "
                     "p_retryable => true)", (first[3],))
    assert claim(worker_a, "k", TOK2)[:2] == ("claimed", 2)
    assert claim(worker_a, "k", TOK1)[0] == "running"  # attempt 1's token is gone
    assert claim(worker_a, "k", TOK2)[:2] == ("claimed", 2)


def test_the_token_answers_under_the_row_lock_too(worker_a: Conn) -> None:
    # A waiter's claim sets has_waiters; the owner's repeated claim still finds its attempt.
    first = claim(worker_a, "k", TOK1)
    assert first[0] == "claimed"
    assert claim(worker_a, "k", None)[0] == "running"
    assert claim(worker_a, "k", TOK1) == first


CLAIM_MANY = ("SELECT outcome, attempt, attempt_token FROM replaysafe.claim_actions(p_tenant_id => 'A', "
              "p_action_keys => %s::text[], p_operations => %s::text[], p_requests => %s::jsonb[], "
              "p_worker_id => 'w', p_claim_tokens => %s::text[])")


def test_claim_actions_takes_one_token_per_key(worker_a: Conn) -> None:
    keys, ops, reqs = ["b", "a"], ["refund", "refund"], ["{}", "{}"]
    ta, tb = tok("ta"), tok("tb")
    first = worker_a.execute(CLAIM_MANY.encode(), (keys, ops, reqs, [tb, ta])).fetchall()
    assert [r[:2] for r in first] == [("claimed", 1), ("claimed", 1)]
    again = worker_a.execute(CLAIM_MANY.encode(), (keys, ops, reqs, [tb, ta])).fetchall()
    assert again == first
    # Tokens swapped between keys, or missing: each key sees a stranger.
    swapped = worker_a.execute(CLAIM_MANY.encode(), (keys, ops, reqs, [ta, tb])).fetchall()
    assert swapped == [("running", 1, None), ("running", 1, None)]
    partial = worker_a.execute(CLAIM_MANY.encode(), (keys, ops, reqs, [None, ta])).fetchall()
    assert partial == [("running", 1, None), first[1]]


@pytest.mark.parametrize("token", ["", "x" * 513, "é" * 513, "\U0001F600" * 300])
def test_bad_tokens_are_refused(worker_a: Conn, token: str) -> None:
    assert sqlstate(worker_a, "SELECT replaysafe.claim_action(p_tenant_id => 'A', "
                    "p_action_key => 'k', p_operation => 'refund', p_request => '{}', "
                    "p_worker_id => 'w', p_claim_token => %s)", (token,)) == "RS005"
    assert sqlstate(worker_a, CLAIM_MANY, (["k"], ["refund"], ["{}"], [token])) == "RS005"
    assert worker_a.execute("SELECT count(*) FROM replaysafe.actions_v").fetchone() == (0,)


def test_the_longest_token_is_taken(worker_a: Conn) -> None:
    assert claim(worker_a, "k", "x" * 512)[0] == "claimed"
    assert claim(worker_a, "k", "x" * 512)[0] == "claimed"


@pytest.mark.parametrize("tokens", [[tok("t1")], [tok("t1"), tok("t2"), tok("t3")], []])
def test_claim_actions_refuses_a_token_array_of_another_length(worker_a: Conn,
                                                               tokens: list[str]) -> None:
    assert sqlstate(worker_a, CLAIM_MANY, (["a", "b"], ["refund"] * 2, ["{}"] * 2,
                                           tokens)) == "RS005"
    assert worker_a.execute("SELECT count(*) FROM replaysafe.actions_v").fetchone() == (0,)
