"""``replaysafe-pg purge`` asks before deleting: refused without a terminal unless ``--yes``,
``--dry-run`` only counts, nothing to delete needs no confirmation. (The batches themselves:
tests/cli/test_cli.py.)"""

from __future__ import annotations

import re
from datetime import timedelta

import psycopg
from helpers.cli import assert_one_line_error, at, run, run_json

from replaysafe_pg import Ledger

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


def test_purge_without_a_terminal_and_without_yes_refuses_and_deletes_nothing(dsn: str) -> None:
    """Without a terminal and without --yes, purge is a one-line error saying what it would
    delete and to pass --yes; no row is deleted."""
    _finished(dsn, 3)
    result = run("purge", "--older-than", "0s", dsn=dsn)
    assert_one_line_error(result, "purge would delete 3 succeeded/failed action(s) finished "
                                  "before", "pass --yes")
    assert _actions(dsn) == 3


def test_purge_dry_run_counts_and_deletes_nothing(dsn: str) -> None:
    """--dry-run says how many actions would go (human and --json) and deletes none."""
    _finished(dsn, 3)
    result = run("purge", "--older-than", "0s", "--dry-run", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert re.match(r"would purge 3 succeeded/failed action\(s\) finished before \S+ \S+ "
                    r"\(dry run, nothing deleted\)$", result.stdout.strip()), result.stdout
    assert run_json("purge", "--older-than", "0s", "--dry-run", dsn=dsn)["would_purge"] == 3
    assert _actions(dsn) == 3


def test_purge_with_yes_deletes_and_prints_the_count(dsn: str) -> None:
    """--yes deletes without asking and prints how many actions were purged."""
    _finished(dsn, 3)
    result = run("purge", "--older-than", "0s", "--yes", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("purged 3 action(s) finished before ")
    assert _actions(dsn) == 0


def test_purge_with_nothing_to_delete_needs_no_confirmation(dsn: str) -> None:
    """With nothing to delete, purge succeeds without --yes and without a terminal."""
    result = run("purge", "--older-than", "0s", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("purged 0 action(s)")


def _old_threads(dsn: str, count: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(count):
            c.execute("SELECT replaysafe.write_thread(p_tenant_id => 't1', p_thread_id => %s, "
                      "p_expected_version => 0, p_state => '{}')", (f"th{i}",))
        c.execute("UPDATE replaysafe.threads SET updated_at = now() - interval '40 days'")


def test_purge_threads_counts_asks_and_purges_old_threads_in_batches(dsn: str) -> None:
    """--threads: the dry run counts the old threads, a run without --yes refuses, --yes
    purges them in batches to tombstones (their version counters kept)."""
    _old_threads(dsn, 3)
    dry = run("purge", "--threads", "--older-than", "30d", "--dry-run", dsn=dsn)
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.startswith("would purge 3 thread(s) not written since ")
    refused = run("purge", "--threads", "--older-than", "30d", dsn=dsn)
    assert_one_line_error(refused, "purge would delete 3 thread(s)", "pass --yes")
    done = run("purge", "--threads", "--older-than", "30d", "--batch-size", "2", "--yes", dsn=dsn)
    assert done.exit_code == 0, done.stderr
    assert re.match(r"purged 3 thread\(s\) not written since \S+ \S+ in 2 batch\(es\)$",
                    done.stdout.strip()), done.stdout
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*), min(version), bool_and(deleted) "
                         "FROM replaysafe.threads").fetchone() == (3, 2, True)
