"""``replaysafe-pg migrate --citus`` (docs/scale-out.md) where Citus is not installed — every
database here: the refusal, the printed script, the options that go with it. The
distribution itself is tested against stand-ins in tests/sql/citus/test_citus_script.py."""

from __future__ import annotations

from helpers.cli import assert_one_line_error, run, run_json

import replaysafe_pg
from replaysafe_pg.schema import citus_sql, head_revision


def test_migrate_citus_without_citus_refuses_before_migrating(empty_dsn: str) -> None:
    result = run("migrate", "--citus", dsn=empty_dsn)
    assert_one_line_error(result, "CitusUnavailable", "citus extension is not installed",
                          "nothing was changed")
    assert replaysafe_pg.current_revision(empty_dsn) is None


def test_migrate_citus_on_a_migrated_database_refuses_and_leaves_it_as_it_was(dsn: str) -> None:
    assert_one_line_error(run("migrate", "--citus", "--shard-count", "64", dsn=dsn),
                          "CitusUnavailable", "CREATE EXTENSION citus")
    report = run_json("doctor", dsn=dsn)
    assert report["ok"] is True
    assert not any(c["check"] == "Citus distribution" for c in report["checks"])


def test_migrate_citus_sql_prints_the_upgrade_then_the_citus_script() -> None:
    result = run("migrate", "--citus", "--sql", dsn="host=/nonexistent dbname=x")
    assert result.exit_code == 0, result.stderr
    upgrade = run("migrate", "--sql", dsn="host=/nonexistent dbname=x").stdout
    assert result.stdout.startswith(upgrade)
    rest = result.stdout[len(upgrade):]
    assert rest.index("BEGIN;") < rest.index(citus_sql().strip()) < rest.rindex("COMMIT;")
    assert f"'{head_revision()}'" in citus_sql()


def test_options_that_go_with_citus_only(dsn: str) -> None:
    assert_one_line_error(run("migrate", "--shard-count", "8", dsn=dsn), "--shard-count goes with --citus")
    assert_one_line_error(run("migrate", "--citus", "--revision", "0002", "--yes", dsn=dsn),
                          "does not go with a downgrade")
    assert replaysafe_pg.current_revision(dsn) == head_revision()
