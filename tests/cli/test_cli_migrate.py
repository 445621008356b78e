"""``migrate``, ``migrate current`` and ``doctor`` as the least-privileged roles the docs
recommend (real LOGIN roles, no table privilege at all), and downgrades that must be asked
for (``migrate --revision OLDER --yes``, ``downgrade(dsn, revision)``)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from helpers.cli import assert_one_line_error, run, run_json
from psycopg import conninfo as pg_conninfo

import replaysafe_pg
from replaysafe_pg import AccessDenied
from replaysafe_pg.schema import head_revision, revisions


def login(dsn: str, role: str) -> str:
    return pg_conninfo.make_conninfo(dsn, user=role)


# --- least privilege ----------------------------------------------------------------------------

@pytest.mark.parametrize("group", ["replaysafe_worker", "replaysafe_auditor"])
def test_doctor_and_migrate_current_as_a_worker_or_an_auditor(
        dsn: str, make_role: Callable[..., str], group: str) -> None:
    as_role = login(dsn, make_role(group))
    head = head_revision()
    assert run_json("migrate", "current", dsn=as_role)["current"] == head
    report = run_json("doctor", dsn=as_role)
    assert report["ok"] is True and report["revision"] == head
    assert report["counts_scope"] == "the tenants this role may read"
    human = run("doctor", dsn=as_role)
    assert human.exit_code == 0, (human.stdout, human.stderr)
    assert "not the schema owner: only the tenants it may read" in human.stdout
    # The application's own DSN may call migrate() at start-up: at head, a no-op.
    assert run("migrate", dsn=as_role).stdout.strip() == f"already at {head}"
    replaysafe_pg.migrate(as_role)
    assert replaysafe_pg.current_revision(as_role) == head


def test_a_role_outside_replaysafe_gets_what_doctor_can_tell_and_one_clear_line(
        dsn: str, make_role: Callable[..., str]) -> None:
    stranger = login(dsn, make_role())
    doctor = run("doctor", dsn=stranger)
    assert doctor.exit_code == 1 and "Traceback" not in doctor.output, doctor.output
    assert "FAIL  schema revision: unknown:" in doctor.stdout
    assert "ok    schema objects owned by the schema owner: yes" in doctor.stdout
    assert "actions by state: not shown" in doctor.stdout
    assert_one_line_error(run("migrate", "current", dsn=stranger), "AccessDenied",
                          "replaysafe_worker")
    with pytest.raises(AccessDenied, match="schema owner"):
        replaysafe_pg.current_revision(stranger)


def test_the_owner_reads_a_revision_older_than_the_function(empty_dsn: str) -> None:
    replaysafe_pg.migrate(empty_dsn, "0003")  # before replaysafe.installed_revision()
    assert run_json("migrate", "current", dsn=empty_dsn)["current"] == "0003"
    assert "FAIL  schema revision: 0003" in run("doctor", dsn=empty_dsn).stdout


def test_migrate_as_a_worker_below_head_says_who_may(empty_dsn: str,
                                                     make_role: Callable[..., str]) -> None:
    replaysafe_pg.migrate(empty_dsn, "0003")
    worker = login(empty_dsn, make_role("replaysafe_worker"))
    with pytest.raises(AccessDenied, match="migrate as its owner"):
        replaysafe_pg.migrate(worker)
    assert replaysafe_pg.current_revision(empty_dsn) == "0003"


def test_doctor_reports_a_schema_missing_what_the_migration_creates(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP FUNCTION replaysafe.read_thread")
    result = run("doctor", dsn=dsn)
    assert result.exit_code == 1
    assert ("FAIL  schema objects the migration creates: MISSING: function read_thread"
            in result.stdout)


# --- downgrades are asked for -----------------------------------------------------------------------

def test_migrate_to_an_older_revision_downgrades_only_with_yes(dsn: str) -> None:
    head = head_revision()
    newest = [r for r in revisions() if r.revision > "0002"]
    refused = run("migrate", "--revision", "0002", dsn=dsn)
    assert_one_line_error(refused, f"would DOWNGRADE from {head}", "--yes",
                          *(r.name for r in newest), "replaysafe.installation")
    assert replaysafe_pg.current_revision(dsn) == head
    done = run("migrate", "--revision", "0002", "--yes", dsn=dsn)
    assert done.exit_code == 0, done.stderr
    assert done.stdout.strip() == f"downgraded from {head} to 0002"
    assert replaysafe_pg.current_revision(dsn) == "0002"
    assert_one_line_error(run("migrate", "--revision", "base", dsn=dsn),
                          "replaysafe.actions", "replaysafe.threads")
    assert run("migrate", dsn=dsn).stdout.strip() == f"migrated from 0002 to {head}"


def test_downgrade_requires_its_target(dsn: str) -> None:
    with pytest.raises(TypeError):
        replaysafe_pg.downgrade(dsn)  # type: ignore[call-arg]
    assert replaysafe_pg.current_revision(dsn) == head_revision()
