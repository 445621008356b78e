"""The security-restricted-operation probe (replaysafe._in_restricted_operation): it must
answer true only inside a security-restricted operation, and elsewhere leave the session as it
was: its own LISTENs, read-only transactions, two-phase commit, memory.

An UNLISTEN of an unused channel (no error raised and caught on every call, ~3 us cheaper) was
tried for revision 0007 and dropped: in a session that has ever LISTENed (the driver's
waiters) it made every transaction that called a function unpreparable and kept ~8 KB per
call until the commit. The last two tests fail on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind

Conn = psycopg.Connection[Any]

REPLAY = ("SELECT outcome FROM replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'done', "
          "p_operation => 'refund', p_request => '{}', p_worker_id => 'w')")


@pytest.fixture
def world(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        claimed = c.execute("SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => 'A', "
                            "p_action_key => 'done', p_operation => 'refund', p_request => '{}', "
                            "p_worker_id => 'w')").fetchone()
        assert claimed is not None
        c.execute("SELECT replaysafe.complete_action(p_tenant_id => 'A', p_action_key => 'done', "
                  "p_attempt => 1, p_attempt_token => %s, p_result => '{\"ok\": true}')", claimed)
    return dsn


def test_the_probe_is_true_only_inside_a_security_restricted_operation(world: str) -> None:
    with psycopg.connect(world, autocommit=True) as owner:
        seen: list[str] = []
        owner.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        assert owner.execute("SELECT replaysafe._in_restricted_operation()").fetchone() == (False,)
        owner.execute("CREATE TABLE public.probe_bait (i integer)")
        owner.execute("""
            CREATE FUNCTION public.probe_idx(integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE
            AS $$ BEGIN RAISE NOTICE 'restricted=%', replaysafe._in_restricted_operation();
                        RETURN $1; END $$""")
        owner.execute("CREATE INDEX ON public.probe_bait (public.probe_idx(i))")
        owner.execute("INSERT INTO public.probe_bait VALUES (1)")  # index insert: not restricted
        owner.execute("ANALYZE public.probe_bait")  # index expressions analyzed: restricted
        assert seen == ["restricted=f", "restricted=t"], seen


def test_the_probe_leaves_the_sessions_own_listen_alone(world: str, worker_a: Conn) -> None:
    worker_a.execute("LISTEN replaysafe_actions")
    for _ in range(3):  # every call probes (autocommit: each its own transaction)
        assert worker_a.execute(REPLAY).fetchone() == ("replay",)
    with worker_a.transaction():  # and in one transaction, next to a LISTEN of its own
        worker_a.execute("LISTEN replaysafe_other")
        assert worker_a.execute(REPLAY).fetchone() == ("replay",)
    assert sorted(r[0] for r in worker_a.execute("SELECT pg_listening_channels()")) == [
        "replaysafe_actions", "replaysafe_other"]
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute("SELECT pg_notify('replaysafe_actions', 'wake')")
    got = next(worker_a.notifies(timeout=5, stop_after=1), None)
    assert got is not None and got.payload == "wake"


@pytest.mark.usefixtures("world")
def test_a_replay_in_a_read_only_transaction(worker_a: Conn) -> None:
    with worker_a.transaction():
        worker_a.execute("SET TRANSACTION READ ONLY")
        assert worker_a.execute(REPLAY).fetchone() == ("replay",)


@pytest.mark.usefixtures("world")
def test_a_connection_that_once_waited_can_still_prepare_a_transaction(worker_a: Conn) -> None:
    """The driver LISTENs on a pooled (or the caller's) connection while it waits and gives it
    back after UNLISTEN; a later two-phase transaction that calls the functions prepares."""
    if worker_a.execute("SHOW max_prepared_transactions").fetchone() == ("0",):
        pytest.skip("max_prepared_transactions = 0 on this server")
    worker_a.execute("LISTEN replaysafe_actions")  # a wait, as the driver does
    worker_a.execute("UNLISTEN replaysafe_actions")  # given back to the pool
    worker_a.execute("BEGIN")
    assert worker_a.execute(REPLAY).fetchone() == ("replay",)
    worker_a.execute("PREPARE TRANSACTION 'rs_probe_2pc'")
    worker_a.execute("ROLLBACK PREPARED 'rs_probe_2pc'")


def test_calls_in_one_transaction_keep_no_memory_per_call_after_a_listen(
        world: str, make_role: Callable[..., str]) -> None:
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    with psycopg.connect(world, autocommit=True) as owner:  # the owner reads its own memory
        owner.execute("LISTEN replaysafe_actions")
        with owner.transaction():
            owner.execute(f'SET LOCAL ROLE "{role}"')  # the calls are the worker's
            owner.execute("""DO $$ BEGIN FOR i IN 1..3000 LOOP
                PERFORM replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'done',
                    p_operation => 'refund', p_request => '{}', p_worker_id => 'w');
                END LOOP; END $$""")
            owner.execute("RESET ROLE")
            row = owner.execute(
                "SELECT sum(total_bytes), count(*) FROM pg_backend_memory_contexts "
                "WHERE name IN ('TopTransactionContext', 'CurTransactionContext')").fetchone()
        assert row is not None
        total, contexts = row
        assert total < 4_000_000 and contexts < 100, (total, contexts)
