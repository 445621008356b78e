"""docs/threads.md, bad input: RS005 naming the argument and nothing written, from the SQL
functions and from the driver (before or at the server)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from helpers.bad_input import LONG
from helpers.threads import table_counts

from replaysafe_pg import (
    InvalidArgument,
    Threads,
)

Conn = psycopg.Connection[Any]


# --- bad input -------------------------------------------------------------------------


BAD_SQL_CALLS = [
    ("p_state", "p_tenant_id => 't', p_thread_id => 'th', p_expected_version => 0, p_state => '[1]'"),
    ("p_state", "p_tenant_id => 't', p_thread_id => 'th', p_expected_version => 0, p_state => '\"s\"'"),
    ("p_state", "p_tenant_id => 't', p_thread_id => 'th', p_expected_version => 0, p_state => NULL"),
    ("p_expected_version",
     "p_tenant_id => 't', p_thread_id => 'th', p_expected_version => -1, p_state => '{}'"),
    ("p_expected_version",
     "p_tenant_id => 't', p_thread_id => 'th', p_expected_version => NULL, p_state => '{}'"),
    ("p_history_limit", "p_tenant_id => 't', p_thread_id => 'th', p_expected_version => 0, "
                        "p_state => '{}', p_history_limit => 0"),
    ("p_tenant_id", f"p_tenant_id => '{LONG}', p_thread_id => 'th', p_expected_version => 0, "
                    "p_state => '{}'"),
    ("p_thread_id", f"p_tenant_id => 't', p_thread_id => '{LONG}', p_expected_version => 0, "
                    "p_state => '{}'"),
    ("p_user_id", f"p_tenant_id => 't', p_thread_id => 'th', p_expected_version => 0, "
                  f"p_state => '{{}}', p_user_id => '{LONG}'"),
    ("p_thread_id", "p_tenant_id => 't', p_thread_id => '', p_expected_version => 0, p_state => '{}'"),
    ("p_tenant_id", "p_tenant_id => NULL, p_thread_id => 'th', p_expected_version => 0, "
                    "p_state => '{}'"),
]


@pytest.mark.parametrize(("argument", "args"), BAD_SQL_CALLS)
def test_bad_write_arguments_raise_rs005_and_write_nothing(conn: Conn, argument: str,
                                                           args: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(f"SELECT replaysafe.write_thread({args})")
    assert err.value.sqlstate == "RS005"
    assert argument in (err.value.diag.message_primary or "")
    assert table_counts(conn) == (0, 0)


@pytest.mark.parametrize("call", [
    "replaysafe.read_thread(p_tenant_id => 't', p_thread_id => '{long}')",
    "replaysafe.read_thread(p_tenant_id => 't', p_thread_id => NULL)",
    "replaysafe.thread_history(p_tenant_id => 't', p_thread_id => 'th', p_limit => 0)",
    "replaysafe.thread_history(p_tenant_id => '{long}', p_thread_id => 'th')",
    "replaysafe.delete_thread(p_tenant_id => 't', p_thread_id => 'th', p_user_id => '')",
])
def test_bad_read_history_delete_arguments_raise_rs005(conn: Conn, call: str) -> None:
    conn.execute("SELECT replaysafe.write_thread(p_tenant_id => 't', p_thread_id => 'th', "
                 "p_expected_version => 0, p_state => '{}')")
    with pytest.raises(psycopg.Error) as err:
        conn.execute(f"SELECT * FROM {call.format(long=LONG)}")
    assert err.value.sqlstate == "RS005"
    assert conn.execute("SELECT version FROM replaysafe.threads").fetchone() == (1,)


def test_driver_rejects_bad_input_before_or_at_the_server(threads: Threads, conn: Conn) -> None:
    threads.write("th", {"a": 1}, 0)
    for bad in (lambda: threads.write("th", [1, 2], 1),  # type: ignore[arg-type]
                lambda: threads.write("th", {"nan": float("nan")}, 1),
                lambda: threads.write("th", {"a": 2}, -1),
                lambda: threads.write("th", {"a": 2}, 1, history_limit=0),
                lambda: threads.write(LONG, {"a": 2}, 0),
                lambda: threads.history("th", limit=0)):
        with pytest.raises(InvalidArgument):
            bad()
    assert table_counts(conn) == (1, 1)
    assert threads.read("th").version == 1
