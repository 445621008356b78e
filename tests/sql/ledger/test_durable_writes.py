"""Every write commits durably, whatever the session's synchronous_commit: a session (or a
pooled server connection another client left) with ``synchronous_commit = off`` would let a
committed claim vanish in a crash, and its tool run again."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

CLAIM = ("SELECT c.outcome, c.attempt_token FROM replaysafe.claim_action(p_tenant_id => 't', "
         "p_action_key => %s, p_operation => 'op', p_request => '{}', p_worker_id => 'w') c")


def _setting(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("weak", ["off", "local"])
def test_a_weak_session_setting_is_raised_for_the_writing_transaction_only(
        dsn: str, weak: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET synchronous_commit = {weak}")
        with conn.transaction():
            claim = conn.execute(CLAIM, ("k",)).fetchone()
            assert claim is not None and claim[0] == "claimed"
            assert _setting(conn) == "on"          # survives the function's exit
            conn.execute("SELECT replaysafe.complete_action(p_tenant_id => 't', p_action_key => 'k', "
                         "p_attempt => 1, p_attempt_token => %s, p_result => '{}')", (claim[1],))
            conn.execute("SELECT replaysafe.write_thread(p_tenant_id => 't', p_thread_id => 'th', "
                         "p_expected_version => 0, p_state => '{}')")
            assert _setting(conn) == "on"
        assert _setting(conn) == weak               # the session's own value afterwards
        with conn.transaction():                    # a replay writes nothing: left alone
            assert conn.execute(CLAIM, ("k",)).fetchone()[0] == "replay"  # type: ignore[index]
            assert _setting(conn) == weak


def test_a_stronger_setting_is_never_lowered(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = remote_apply")
        with conn.transaction():
            conn.execute(CLAIM, ("k2",))
            assert _setting(conn) == "remote_apply"


def test_a_revocation_and_a_key_rotation_are_durable_too(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        with conn.transaction():
            conn.execute("SELECT replaysafe.revoke_tenant_grants(p_tenant_id => 't')")
            assert _setting(conn) == "on"
        with conn.transaction():
            conn.execute("SELECT replaysafe.rotate_grant_key()")
            assert _setting(conn) == "on"
