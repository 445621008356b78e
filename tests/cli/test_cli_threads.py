"""``replaysafe-pg threads show | history`` on a thread that belongs to a user: the error says
to pass ``--user`` (or that the thread is another user's). (Thread output: tests/cli/test_cli.py.)"""

from __future__ import annotations

import psycopg
import pytest
from helpers.cli import assert_one_line_error, run


def _owned_thread(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT replaysafe.write_thread(p_tenant_id => 't1', p_thread_id => 'th', "
                     "p_expected_version => 0, p_state => '{}'::jsonb, p_user_id => 'u1')")


@pytest.mark.parametrize("command", ["show", "history"])
def test_an_owned_thread_without_user_says_to_pass_user(dsn: str, command: str) -> None:
    """A thread created with a user, read without --user, is a one-line AccessDenied saying
    to pass --user; with another user, one saying it belongs to another user."""
    _owned_thread(dsn)
    assert_one_line_error(run("threads", command, "th", "--tenant", "t1", dsn=dsn),
                          "AccessDenied", "thread th belongs to a user", "pass --user")
    assert_one_line_error(run("threads", command, "th", "--tenant", "t1", "--user", "u2", dsn=dsn),
                          "AccessDenied", "belongs to another user than u2")
