"""The driver's prepared statements are named by their content; where a name meets another
statement's (a pooler sharing server connections), the statement goes again unnamed."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from helpers.db import own_connection

from replaysafe_pg import DatabaseUnavailable, Ledger


def _names(conn: psycopg.Connection[Any]) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM pg_prepared_statements")}


def test_statements_are_prepared_under_names_of_their_content(dsn: str) -> None:
    """On a direct connection (its server session is its own), after psycopg's five uses."""
    names = []
    for _ in range(2):
        with Ledger(dsn, tenant_id="t1") as ledger:
            for i in range(6):
                assert ledger.get(f"k{i}") is None
            assert own_connection(ledger).__dict__["_replaysafe_own_session"] is True
            names.append(_names(own_connection(ledger)))
    assert len(names[0]) == 1 and names[0] == names[1], "one name for one statement"
    (name,) = names[0]
    assert name.startswith("rs_") and len(name) == 43


def test_prepare_false_sends_every_statement_unnamed(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1", prepare=False) as ledger:
        for i in range(6):
            ledger.get(f"k{i}")
        assert _names(own_connection(ledger)) == set()


def test_a_connection_with_psycopgs_own_names_gets_unnamed_statements(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(6):
            conn.execute("SELECT %s::int", (1,))
        mine = _names(conn)
        assert len(mine) == 1 and next(iter(mine)).startswith("_pg3_")
        ledger = Ledger(conn, tenant_id="t1")
        for i in range(6):
            ledger.get(f"k{i}")
        assert _names(conn) == mine


def test_a_name_already_taken_on_the_server_session_falls_back_to_unnamed(dsn: str) -> None:
    """What a pooler does when another client prepared there first (42P05)."""
    with Ledger(dsn, tenant_id="t1") as first:
        first.run("op", lambda: {"x": 1}, {}, key="k0")
        for _ in range(6):
            first.get("k0")
        (name,) = _names(own_connection(first))  # get_action's: the one statement used five times
    with Ledger(dsn, tenant_id="t1") as second:
        assert second.get("k0") is not None
        own_connection(second).execute(f"PREPARE {name} AS SELECT 1")
        for _ in range(6):
            action = second.get("k0")
            assert action is not None and action.result == {"x": 1}
        assert own_connection(second).__dict__.get("_replaysafe_unnamed") is True


def test_a_name_gone_from_the_server_session_falls_back_to_unnamed(dsn: str) -> None:
    """What a pooler does when the next statement lands on another server connection
    (26000): the name is unknown there."""
    with Ledger(dsn, tenant_id="t1") as ledger:
        for _ in range(6):
            ledger.get("k0")
        conn = own_connection(ledger)
        (name,) = _names(conn)
        conn.execute(f"DEALLOCATE {name}")
        assert ledger.get("k0") is None
        assert conn.__dict__.get("_replaysafe_unnamed") is True
        ledger.get("k0")
        assert _names(conn) == set()


def test_inside_the_callers_transaction_the_refusal_is_raised(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        ledger = Ledger(conn, tenant_id="t1")
        for _ in range(6):
            ledger.get("k0")
        conn.commit()
        (name,) = _names(conn)
        conn.execute(f"DEALLOCATE {name}")
        conn.commit()
        with conn.transaction():
            with pytest.raises(DatabaseUnavailable, match="transaction pooler"):
                ledger.get("k0")
            raise psycopg.Rollback
