"""Every statement the driver and the command line send names the schema of each type,
function and operator in it: none resolves through the caller's search_path, which is the
login's default (no search_path is pinned at connection time: PgBouncer refuses the startup
``options``), and may let a hostile role's overload in ``public`` run with the caller's
rights (tests/helpers/qualified.py says how; tests/sql/isolation/test_search_path_pinning.py plants them)."""

from __future__ import annotations

import pytest
from helpers.qualified import unqualified

from replaysafe_pg import _listen, queries, schema


def _sent() -> dict[str, str]:
    sent: dict[str, str] = {}
    for name in queries.all_queries():
        # Both forms of a time-sensitive query: p_now left to its default, and given.
        sent[f"queries.sql {name}"] = queries.get(name, {})
        sent[f"queries.sql {name} (p_now given)"] = queries.get(name, {"now": 1})
    for name, query in queries._file("cli.sql").items():
        sent[f"cli.sql {name}"] = query
    for constant in ("REVISION_PROBE_SQL", "REVISION_BY_FUNCTION_SQL", "REVISION_BY_TABLE_SQL",
                     "CITUS_VERSION_SQL"):
        sent[f"schema.{constant}"] = getattr(schema, constant)
    sent["_listen.LISTEN"] = _listen.LISTEN
    sent["_listen.PROBE"] = _listen.PROBE
    return sent


SENT = _sent()


def test_both_forms_of_the_time_sensitive_queries_are_checked() -> None:
    timed = [n for n in queries.all_queries() if queries.takes_now(n)]
    assert timed and all(SENT[f"queries.sql {n}"] != SENT[f"queries.sql {n} (p_now given)"]
                         for n in timed)
    assert "cli.sql list_actions" in SENT


@pytest.mark.parametrize("name", sorted(SENT))
def test_the_statement_resolves_no_name_through_the_search_path(name: str) -> None:
    assert unqualified(SENT[name]) == []


@pytest.mark.parametrize("sql", [
    "SELECT x::text",
    "SELECT now()",
    "WHERE a = b",
    "WHERE a IN ('x')",
    "CASE k WHEN 'r' THEN 1 END",
    "a IS DISTINCT FROM b",
    "a IS NOT DISTINCT FROM b",
    "pg_catalog.cardinality(x) = 0",
    "SELECT public.cardinality(x)",
    "x OPERATOR(public.=) y",
    "x BETWEEN a AND b",
    "x LIKE 'a%'",
    "NULLIF(a, b)",
    "SELECT \"now\"()",
    "SELECT timestamptz 'today'",
    "SELECT 1 FROM actions_v",
])
def test_the_checker_reports(sql: str) -> None:
    assert unqualified(sql) != []


@pytest.mark.parametrize("sql", [
    "SELECT * FROM replaysafe.f(p_a => %(a)s::pg_catalog.text)",
    "x OPERATOR(pg_catalog.=) ANY (ARRAY['a'])",
    # Literals, quoted names, comments and placeholders are never looked into.
    "SELECT 'a = now()' AS \"x = y\", %(b)b::pg_catalog.bytea[] -- a = b",
    "SELECT pg_catalog.count(*), t.* FROM pg_catalog.unnest(ARRAY['a']) AS t(name)",
    "SELECT coalesce(x, y) FROM replaysafe.v WHERE NOT EXISTS (SELECT 1) AND x IS NULL",
])
def test_the_checker_passes(sql: str) -> None:
    assert unqualified(sql) == []
