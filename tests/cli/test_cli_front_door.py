"""Issue 10, item 9: purge asks first, --debug keeps the exit status, thread owner hint, one
time format, help without reST literals, --version, a sync run inside an event loop."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
from datetime import timedelta
from typing import Any

import click
import psycopg
import pytest
from helpers.cli import assert_one_line_error, at, run, run_json

from replaysafe_pg import InvalidArgument, Ledger
from replaysafe_pg.cli import main

LEASE = timedelta(seconds=30)


def _finished(dsn: str, count: int) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for i in range(count):
            c = led.claim(f"k{i}", "refund", {"i": i}, lease=LEASE, now=at(i))
            led.complete(c, {"ok": True}, now=at(i + 1))


def _actions(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM replaysafe.actions").fetchone()
    assert row is not None
    return int(row[0])


# --- purge ----------------------------------------------------------------------------------

def test_purge_without_a_terminal_and_without_yes_refuses_and_deletes_nothing(dsn: str) -> None:
    _finished(dsn, 3)
    result = run("purge", "--older-than", "0s", dsn=dsn)
    assert_one_line_error(result, "purge would delete 3 succeeded/failed action(s) finished "
                                  "before", "pass --yes")
    assert _actions(dsn) == 3


def test_purge_dry_run_counts_and_deletes_nothing(dsn: str) -> None:
    _finished(dsn, 3)
    result = run("purge", "--older-than", "0s", "--dry-run", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert re.match(r"would purge 3 succeeded/failed action\(s\) finished before \S+ \S+ "
                    r"\(dry run, nothing deleted\)$", result.stdout.strip()), result.stdout
    assert run_json("purge", "--older-than", "0s", "--dry-run", dsn=dsn)["would_purge"] == 3
    assert _actions(dsn) == 3


def test_purge_with_yes_deletes_and_prints_the_count(dsn: str) -> None:
    _finished(dsn, 3)
    result = run("purge", "--older-than", "0s", "--yes", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("purged 3 action(s) finished before ")
    assert _actions(dsn) == 0


def test_purge_with_nothing_to_delete_needs_no_confirmation(dsn: str) -> None:
    result = run("purge", "--older-than", "0s", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("purged 0 action(s)")


# --- threads --------------------------------------------------------------------------------

def _owned_thread(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT replaysafe.write_thread(p_tenant_id => 't1', p_thread_id => 'th', "
                     "p_expected_version => 0, p_state => '{}'::jsonb, p_user_id => 'u1')")


@pytest.mark.parametrize("command", ["show", "history"])
def test_an_owned_thread_without_user_says_to_pass_user(dsn: str, command: str) -> None:
    _owned_thread(dsn)
    assert_one_line_error(run("threads", command, "th", "--tenant", "t1", dsn=dsn),
                          "AccessDenied", "thread th belongs to a user", "pass --user")
    assert_one_line_error(run("threads", command, "th", "--tenant", "t1", "--user", "u2", dsn=dsn),
                          "AccessDenied", "belongs to another user than u2")


# --- one time format ------------------------------------------------------------------------

def test_actions_show_prints_attempt_times_like_every_other_table(dsn: str) -> None:
    _finished(dsn, 1)
    human = run("actions", "show", "k0", "--tenant", "t1", dsn=dsn).stdout
    attempts = human.split("attempts:\n", 1)[1].splitlines()
    assert attempts[1].split()[2:6] == [
        "2026-01-01", "12:00:00+00:00", "2026-01-01",
        "12:00:01+00:00"], attempts
    assert "T12:00" not in human
    listed = run("actions", "list", dsn=dsn).stdout
    assert "2026-01-01 12:00:00+00:00" in listed


# --- help, version --------------------------------------------------------------------------

def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


def test_no_help_text_shows_rest_or_markdown_backticks() -> None:
    paths = _commands(main)
    assert ("server", "start") in paths and ("purge",) in paths
    for path in paths:
        result = run(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        assert "`" not in result.stdout, (path, result.stdout)


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"replaysafe-pg {importlib.metadata.version('replaysafe-pg')}"


# --- a sync run inside a running event loop -------------------------------------------------

def test_sync_run_inside_a_running_event_loop_is_refused_not_blocking(dsn: str) -> None:
    calls: list[Any] = []

    async def agent() -> None:
        with Ledger(dsn, tenant_id="t1") as led:
            with pytest.raises(InvalidArgument, match=r"use AsyncLedger\.run \(await it\)"):
                led.run("refund", lambda: calls.append(1), {}, key="k")
            with pytest.raises(InvalidArgument, match=r"use AsyncLedger\.run_many"):
                led.run_many([("refund", lambda: calls.append(1), {}, "k2")])

    asyncio.run(agent())
    assert calls == [] and _actions(dsn) == 0
    # Outside a loop (or in a worker thread of one) it runs as before.
    with Ledger(dsn, tenant_id="t1") as led:
        assert led.run("refund", lambda: 7, {}, key="k").result == 7


def test_dsn_on_the_command_line_wins_over_the_environment_at_every_level(
        dsn: str, empty_dsn: str) -> None:
    # REPLAYSAFE_DSN is read again by the subcommand: it must not replace the --dsn before it.
    result = run("--dsn", dsn, "audit", env={"REPLAYSAFE_DSN": empty_dsn})
    assert result.exit_code == 0, result.stderr
    assert run("audit", env={"REPLAYSAFE_DSN": empty_dsn}).exit_code == 2
