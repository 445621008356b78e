"""docs/threads.md, ownership: a thread written with a user id is that user's (other users get
RS004, which reveals nothing), also after it was deleted; a thread without one is shared
within the tenant; the same thread id in two tenants is two threads."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
import pytest
from helpers.threads import table_counts

from replaysafe_pg import (
    AccessDenied,
    Threads,
)

Conn = psycopg.Connection[Any]


# --- ownership -------------------------------------------------------------------------

def test_other_users_get_rs004_that_reveals_nothing(dsn: str, conn: Conn) -> None:
    with Threads(dsn, tenant_id="t1", user_id="alice") as alice:
        for v in range(7):
            alice.write("th", {"diary": "TOPSECRET"}, v)
    before = table_counts(conn)
    for intruder in ("bob", None):
        with Threads(dsn, tenant_id="t1", user_id=intruder) as other:
            calls: list[Callable[[], object]] = [
                partial(other.read, "th"),
                partial(other.write, "th", {"x": 1}, 7),
                partial(other.write, "th", {"x": 1}, 0),
                partial(other.history, "th"),
                partial(other.delete, "th")]
            for call in calls:
                with pytest.raises(AccessDenied) as err:
                    call()
                cause = err.value.__cause__
                assert isinstance(cause, psycopg.Error)
                assert cause.sqlstate == "RS004"
                told = " ".join(filter(None, (cause.diag.message_primary, cause.diag.message_detail,
                                              cause.diag.message_hint)))
                for secret in ("TOPSECRET", "alice", "7"):
                    assert secret not in told, told
    assert table_counts(conn) == before
    with Threads(dsn, tenant_id="t1", user_id="alice") as alice:
        assert alice.read("th").version == 7


def test_ownership_survives_delete(dsn: str) -> None:
    with Threads(dsn, tenant_id="t1", user_id="alice") as alice, \
         Threads(dsn, tenant_id="t1", user_id="bob") as bob:
        alice.write("th", {"a": 1}, 0)
        assert alice.delete("th") is True
        with pytest.raises(AccessDenied):
            bob.write("th", {"b": 1}, 2)
        with pytest.raises(AccessDenied):
            bob.read("th")
        assert alice.write("th", {"a": 2}, 2) == 3


def test_thread_without_user_is_shared_within_the_tenant(dsn: str, conn: Conn) -> None:
    with Threads(dsn, tenant_id="t1") as anyone, \
         Threads(dsn, tenant_id="t1", user_id="bob") as bob:
        anyone.write("th", {"a": 1}, 0)
        assert bob.write("th", {"b": 1}, 1) == 2
        assert anyone.read("th").state == {"b": 1}
    # Writing with a user id does not make the shared thread that user's.
    assert conn.execute("SELECT user_id FROM replaysafe.threads").fetchone() == (None,)


def test_same_thread_id_in_two_tenants_are_two_threads(dsn: str) -> None:
    with Threads(dsn, tenant_id="t1") as one, Threads(dsn, tenant_id="t2") as two:
        one.write("th", {"t": 1}, 0)
        assert two.read("th").version == 0
        assert two.write("th", {"t": 2}, 0) == 1
        assert one.read("th").state == {"t": 1}
