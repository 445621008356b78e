"""Function sets (docs/migrations.md): each revision step's DDL is followed by the function
set of the revision it arrives at. Every downgrade restores its predecessor exactly; after a
migration the schema's functions are exactly the tree's; a left-over signature or a body
that does not compile stops the step and changes nothing."""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable

import psycopg
import pytest
from test_migrations import ROOT, alembic, pg_tool, schema_dump, versions

import replaysafe_pg
from replaysafe_pg import _sqltree
from replaysafe_pg.schema import head_revision, revisions

CHAIN = [r.revision for r in revisions()]


def functions_in(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as c:
        return {r[0] for r in c.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'replaysafe'::regnamespace")}


@pytest.mark.parametrize(("predecessor", "revision"), list(itertools.pairwise(CHAIN)))
def test_each_downgrade_restores_its_predecessor(new_db: Callable[[], str], predecessor: str,
                                                 revision: str) -> None:
    at_predecessor, there_and_back = new_db(), new_db()
    replaysafe_pg.migrate(at_predecessor, predecessor)
    replaysafe_pg.migrate(there_and_back, revision)
    replaysafe_pg.downgrade(there_and_back, predecessor)
    assert schema_dump(there_and_back) == schema_dump(at_predecessor)
    assert versions(there_and_back) == [predecessor]


def test_after_migrate_the_functions_are_exactly_the_trees(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        expected = {c.execute("SELECT %s::regprocedure::text", (s,)).fetchone()[0]  # type: ignore[index]
                    for s in _sqltree.signatures(_sqltree.function_set_sql())}
    assert functions_in(dsn) == expected
    assert {"replaysafe.installed_revision()", "replaysafe.bind_role_to_tenant(text,text)"} <= expected


def test_a_left_over_signature_stops_the_step(new_db: Callable[[], str]) -> None:
    dsn = new_db()
    replaysafe_pg.migrate(dsn, CHAIN[-2])
    with psycopg.connect(dsn, autocommit=True) as c:
        # What a revision that adds a parameter but forgets to DROP the old signature leaves.
        c.execute("CREATE FUNCTION replaysafe.claim_action(p_tenant_id text) RETURNS int "
                  "LANGUAGE sql AS 'SELECT 1'")
    before = schema_dump(dsn)
    with pytest.raises(Exception, match=r"does not define: replaysafe\.claim_action\(text\)"):
        replaysafe_pg.migrate(dsn)
    assert versions(dsn) == [CHAIN[-2]]
    assert schema_dump(dsn) == before


def _apply(dsn: str, function_set: str) -> None:
    """A function set applied as a revision step applies it: one transaction, the owner."""
    with psycopg.connect(dsn) as c:
        c.execute(function_set.encode())  # type: ignore[call-overload]


def _tree_with(monkeypatch: pytest.MonkeyPatch, part: str, old: str, new: str) -> str:
    real = _sqltree.read

    def edited(name: str) -> str:
        text = real(name)
        if name == part:
            assert old in text
            return text.replace(old, new)
        return text

    monkeypatch.setattr(_sqltree, "read", edited)
    return _sqltree.function_set_sql()


def test_a_body_that_does_not_compile_stops_the_set(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = schema_dump(dsn)
    broken = _tree_with(monkeypatch, "functions/checks.sql", "PERFORM replaysafe._raise('RS005'",
                        "PERFORM replaysafe._raise('RS005' +")
    with pytest.raises(psycopg.errors.SyntaxError):
        _apply(dsn, broken)
    assert schema_dump(dsn) == before


def test_a_grant_of_a_function_that_does_not_exist_stops_the_set(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = schema_dump(dsn)
    misspelt = _tree_with(monkeypatch, "grants.sql", "'claim_actions'", "'claim_action_batch'")
    with pytest.raises(psycopg.errors.RaiseException,
                       match="names a function that does not exist: claim_action_batch"):
        _apply(dsn, misspelt)
    assert schema_dump(dsn) == before


def _psql(dsn: str, script: str) -> None:
    done = subprocess.run([pg_tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", f"--dbname={dsn}"],
                          input=script, text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_offline_sql_carries_the_function_sets_up_and_down(new_db: Callable[[], str]) -> None:
    ini = str(ROOT / "alembic.ini")
    predecessor, head = CHAIN[-2], head_revision()
    up = alembic("-c", ini, "upgrade", f"{predecessor}:{head}", "--sql")
    down = alembic("-c", ini, "downgrade", f"{head}:{predecessor}", "--sql")
    assert up.returncode == 0 and down.returncode == 0, up.stderr + down.stderr
    for script in (up.stdout, down.stdout):
        assert script.count("DO $function_set$") == 1 and script.count("DO $citus_guard$") == 1
    reference, dsn = new_db(), new_db()
    replaysafe_pg.migrate(reference, predecessor)
    replaysafe_pg.migrate(dsn, predecessor)
    _psql(dsn, up.stdout)
    assert versions(dsn) == [head]
    at_head = new_db()
    replaysafe_pg.migrate(at_head)
    assert schema_dump(dsn) == schema_dump(at_head)
    _psql(dsn, down.stdout)
    assert versions(dsn) == [predecessor]
    assert schema_dump(dsn) == schema_dump(reference)


def test_a_step_to_a_released_revision_applies_its_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the tree: a released revision's function set is frozen at its release; the tree
    serves the unreleased head only."""
    released = sorted(r for r in _sqltree.released_revisions() if r >= "0009")
    assert released
    monkeypatch.setattr(_sqltree, "function_set_sql", lambda: "-- the tree\n")
    for revision in released:
        assert _sqltree.function_set_of(revision, "9999") == _sqltree.snapshot_path(revision).read_text()
    assert _sqltree.function_set_of("9998", head="9998") == "-- the tree\n"
    with pytest.raises(RuntimeError, match="neither released nor the head"):
        _sqltree.function_set_of("9997", head="9998")
    monkeypatch.setattr(_sqltree, "released_revisions", lambda directory=None: {"0008"})
    with pytest.raises(RuntimeError, match="released without a snapshot"):
        _sqltree.function_set_of("0008", "9999")
