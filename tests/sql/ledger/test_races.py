"""Races on real connections: simultaneous claims, claims against sweeps, reclaims and
fencing, each also as a scripted interleaving (one session holds the row lock, the others
are observed blocking with pg_blocking_pids or skipping it)."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers.fixed_clock import at
from helpers.ledger_race import (
    Background,
    claim_sql,
    claim_with_token,
    install_transition_log,
    process_claim,
    run_together,
    transitions,
    wait_until_blocked,
)

N = 16


@pytest.fixture
def connect(dsn: str) -> Iterator[Any]:
    opened: list[psycopg.Connection[Any]] = []

    def make() -> psycopg.Connection[Any]:
        c = psycopg.connect(dsn, autocommit=True)
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.close()


def action(conn: psycopg.Connection[Any], key: str = "k") -> tuple[Any, ...]:
    row = conn.execute("SELECT state, attempt, has_waiters FROM replaysafe.actions "
                       "WHERE tenant_id = 't1' AND action_key = %s", (key,)).fetchone()
    assert row is not None
    return tuple(row)


def attempt_rows(conn: psycopg.Connection[Any], key: str = "k") -> list[tuple[Any, ...]]:
    return conn.execute("SELECT attempt, outcome, ended_at, superseded FROM "
                        "replaysafe.action_attempts_v WHERE action_key = %s ORDER BY attempt",
                        (key,)).fetchall()


# --- (a) many connections claim one new key at once ------------------------------------------

def test_16_threads_claim_one_new_key_exactly_one_wins(connect: Any, conn: Any) -> None:
    conns = [connect() for _ in range(N)]
    outcomes = run_together([
        (lambda c=c, i=i: claim_sql(c, "k", at(0), worker=f"w{i}")) for i, c in enumerate(conns)])
    assert Counter(outcomes) == {("claimed", 1): 1, ("running", 1): N - 1}
    assert len(attempt_rows(conn)) == 1
    assert action(conn) == ("running", 1, True)


def test_16_processes_claim_one_new_key_exactly_one_wins(dsn: str, conn: Any) -> None:
    # fork: the children only open connections of their own, and skip re-importing.
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(N)
    out = ctx.Queue()
    procs = [ctx.Process(target=process_claim, args=(dsn, "k", at(0), barrier, out))
             for _ in range(N)]
    for p in procs:
        p.start()
    outcomes = [out.get(timeout=120) for _ in range(N)]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert Counter(outcomes) == {("claimed", 1): 1, ("running", 1): N - 1}
    assert len(attempt_rows(conn)) == 1


# --- (b) a claim racing a sweep on an expired lease ------------------------------------------

@pytest.mark.parametrize("policy", ["unknown", "reclaim"])
@pytest.mark.parametrize("holder", ["sweep", "claim"])
def test_claim_racing_sweep_on_expired_lease(connect: Any, conn: Any, holder: str,
                                             policy: str) -> None:
    install_transition_log(conn)
    claim_sql(conn, "k", at(0), policy=policy)  # attempt 1, lease until at(30)
    a, b, c = connect(), connect(), connect()
    b.execute("SET lock_timeout = '2s'")  # a sweep that waited would fail, not hang

    # A moves the expired action and keeps its row lock in an open transaction.
    a.execute("BEGIN")
    if holder == "sweep":
        assert a.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                         (at(31),)).fetchone() == (1,)
    else:
        first = claim_sql(a, "k", at(31), worker="A", policy=policy)
        assert first == (("unknown", 1) if policy == "unknown" else ("claimed", 2))

    # B: another sweep skips the locked row instead of waiting for it.
    assert b.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                     (at(31),)).fetchone() == (0,)
    # C: a claim must wait for A's decision.
    c_pid = c.info.backend_pid
    blocked = Background(lambda: claim_sql(c, "k", at(32), worker="C", policy=policy))
    wait_until_blocked(conn, c_pid, a.info.backend_pid)
    assert not blocked.done()
    a.execute("COMMIT")
    late = blocked.result()

    if policy == "unknown":
        assert late == ("unknown", 1)
        assert action(conn)[:2] == ("unknown", 1)
        assert transitions(conn, "actions") == [("k", 1, "running", "unknown")]
    elif holder == "sweep":
        # The sweep made it retryable; the claim that waited runs attempt 2.
        assert late == ("claimed", 2)
        assert transitions(conn, "actions") == [("k", 1, "running", "retryable"),
                                                ("k", 2, "retryable", "running")]
    else:
        # A reclaimed it; C sees attempt 2's live lease.
        assert late == ("running", 2)
        assert transitions(conn, "actions") == [("k", 2, "running", "running")]
    # Attempt 1 was closed exactly once, by whoever noticed the expiry first.
    closed = [t for t in transitions(conn, "attempts") if t[1] == 1]
    assert closed == [("k", 1, None, "unknown")]
    rows = attempt_rows(conn)
    assert rows[0][:3] == (1, "unknown", at(31))
    assert len(rows) == (1 if policy == "unknown" else 2)
    # Nothing is left for a later sweep.
    assert b.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                     (at(33),)).fetchone() == (0,)


# --- (c) two workers reclaiming one expired lease ---------------------------------------------

def test_concurrent_reclaims_of_one_expired_lease_have_one_winner(connect: Any, conn: Any) -> None:
    rounds, workers = 10, 4
    conns = [connect() for _ in range(workers)]
    for r in range(rounds):
        claim_sql(conn, f"k{r}", at(0), policy="reclaim")
    for r in range(rounds):
        got = run_together([
            (lambda c=c, i=i, key=f"k{r}": claim_sql(c, key, at(31), worker=f"w{i}",
                                                     policy="reclaim"))
            for i, c in enumerate(conns)])
        assert Counter(got) == {("claimed", 2): 1, ("running", 2): workers - 1}, r
        assert [(a, o) for a, o, _, _ in attempt_rows(conn, f"k{r}")] == [(1, "unknown"), (2, None)]


def test_second_reclaim_blocks_on_the_first_then_sees_running(connect: Any, conn: Any) -> None:
    install_transition_log(conn)
    claim_sql(conn, "k", at(0), policy="reclaim")
    a, b = connect(), connect()
    a.execute("BEGIN")
    assert claim_sql(a, "k", at(31), worker="A", policy="reclaim") == ("claimed", 2)
    second = Background(lambda: claim_sql(b, "k", at(31), worker="B", policy="reclaim"))
    wait_until_blocked(conn, b.info.backend_pid, a.info.backend_pid)
    a.execute("COMMIT")
    assert second.result() == ("running", 2)
    assert action(conn) == ("running", 2, True)
    assert transitions(conn, "actions") == [("k", 2, "running", "running")]
    assert [t for t in transitions(conn, "attempts") if t[1] == 1] == [("k", 1, None, "unknown")]


# --- (d) fencing under races ----------------------------------------------------------------

REPORTS = {
    "complete": "SELECT replaysafe.complete_action(p_tenant_id => 't1', p_action_key => 'k', "
                "p_attempt => %(attempt)s, p_attempt_token => %(token)s, p_result => %(payload)s, "
                "p_now => %(now)s)",
    "fail": "SELECT replaysafe.fail_action(p_tenant_id => 't1', p_action_key => 'k', "
            "p_attempt => %(attempt)s, p_attempt_token => %(token)s, p_error => %(payload)s, "
            "p_now => %(now)s)",
    "mark_unknown": "SELECT replaysafe.mark_action_unknown(p_tenant_id => 't1', "
                    "p_action_key => 'k', p_attempt => %(attempt)s, p_attempt_token => %(token)s, "
                    "p_error => %(payload)s, p_now => %(now)s)",
}


def report(c: psycopg.Connection[Any], kind: str, attempt: int, tokens: dict[int, str],
           who: str) -> str:
    """A report of ``attempt`` with that attempt's own token (each worker keeps its claim's)."""
    row = c.execute(REPORTS[kind], {"attempt": attempt, "token": tokens[attempt],
                                    "payload": psycopg.types.json.Jsonb({"from": who}),
                                    "now": at(40)}).fetchone()
    assert row is not None
    return str(row[0])


def two_attempts(conn: psycopg.Connection[Any]) -> dict[int, str]:
    """Attempt 1 (expired) and attempt 2 (running) of "k": each attempt's token."""
    outcome, _, first = claim_with_token(conn, "k", at(0), policy="reclaim")
    assert outcome == "claimed" and first is not None
    outcome, attempt, second = claim_with_token(conn, "k", at(31), policy="reclaim")
    assert (outcome, attempt) == ("claimed", 2) and second is not None
    return {1: first, 2: second}


def assert_new_attempt_won(conn: psycopg.Connection[Any], stale_kind: str) -> None:
    state, result, error = conn.execute(
        "SELECT state, result, error FROM replaysafe.actions WHERE action_key = 'k'").fetchone()
    assert (state, result, error) == ("succeeded", {"from": "new"}, None)
    rows = attempt_rows(conn)
    stale_outcome = {"complete": "succeeded", "fail": "failed", "mark_unknown": "unknown"}
    # The stale report is kept on its attempt row only (it replaces the expiry's "unknown").
    assert (rows[0][1], rows[0][3]) == (stale_outcome[stale_kind], True)
    assert (rows[1][1], rows[1][3]) == ("succeeded", False)


@pytest.mark.parametrize("stale_kind", ["complete", "fail", "mark_unknown"])
def test_stale_and_new_reports_at_once_new_wins(connect: Any, conn: Any, stale_kind: str) -> None:
    rounds = 5
    old, new = connect(), connect()
    for _ in range(rounds):
        conn.execute("DELETE FROM replaysafe.action_attempts; DELETE FROM replaysafe.actions")
        tokens = two_attempts(conn)
        outcomes = run_together([lambda t=tokens: report(old, stale_kind, 1, t, "old"),
                                  lambda t=tokens: report(new, "complete", 2, t, "new")])
        assert outcomes == ["superseded", "recorded"]
        assert_new_attempt_won(conn, stale_kind)


@pytest.mark.parametrize("stale_first", [True, False])
@pytest.mark.parametrize("stale_kind", ["complete", "fail", "mark_unknown"])
def test_stale_report_scripted_against_new_completion(connect: Any, conn: Any, stale_kind: str,
                                                      stale_first: bool) -> None:
    tokens = two_attempts(conn)
    a, b = connect(), connect()
    # An older attempt's report is superseded for good and locks only its own attempt row:
    # neither report waits for the other's transaction (a wait would hit the lock_timeout).
    b.execute("SET lock_timeout = '2s'")
    a.execute("BEGIN")
    if stale_first:
        assert report(a, stale_kind, 1, tokens, "old") == "superseded"
        assert report(b, "complete", 2, tokens, "new") == "recorded"
    else:
        assert report(a, "complete", 2, tokens, "new") == "recorded"
        assert report(b, stale_kind, 1, tokens, "old") == "superseded"
    a.execute("COMMIT")
    assert_new_attempt_won(conn, stale_kind)
