"""Python and SQL agree: every query the driver sends resolves with the argument types it
sends, enums and record shapes match, every RS SQLSTATE maps to its exception class, and
the derived idempotency key comes from the database only (a claim's answer), never from a
Python helper."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import cloned_database
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaysafe_pg import errors, queries
from replaysafe_pg.models import Action, ActionState, Attempt, Claim


@pytest.fixture(scope="module")
def conn(admin_dsn: str, template_db: str) -> Iterator[psycopg.Connection[Any]]:
    """Every test here only reads: one database for the module."""
    with cloned_database(admin_dsn, template_db) as dsn, \
            psycopg.connect(dsn, autocommit=True) as c:
        yield c


CALL = re.compile(r"replaysafe\.(\w+)\(")
PARAM = re.compile(r"%\((\w+)\)[sbt](?:::([\w.\[\] ]+))?")
NAMED = re.compile(r"^(p_\w+) => (.*)$", re.DOTALL)


def split_args(query: str, start: int) -> list[str]:
    """Top-level comma-separated arguments of the call whose '(' is at ``start``."""
    depth, parts, current = 0, [], ""
    for ch in query[start + 1:]:
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                parts.append(current.strip())
                return parts
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += ch
    raise AssertionError("unbalanced call")


def sent_types(query: str) -> tuple[str, dict[str, str]]:
    """The function a query calls and, per named argument, the type the driver sends."""
    m = CALL.search(query)
    assert m is not None
    sent: dict[str, str] = {}
    for arg in split_args(query, m.end() - 1):
        named = NAMED.match(arg)
        assert named, f"{m.group(1)}: positional argument {arg!r} (use named notation)"
        param = PARAM.search(named.group(2))
        assert param, f"{m.group(1)}: {arg!r} sends no parameter"
        # An uncast parameter goes out as "unknown" and resolves as text.
        sent[named.group(1)] = param.group(2) or "text"
    return m.group(1), sent


def _sent_forms() -> dict[str, str]:
    """Every form the driver sends: a time-sensitive query with and without its p_now."""
    forms: dict[str, str] = {}
    for name, query in queries.all_queries().items():
        forms[name] = query
        if queries.takes_now(name):
            forms[f"{name}{DEFAULTED}"] = queries.get(name, {"now": None})
    return forms


DEFAULTED = " (p_now left to its default)"
FUNCTION_QUERIES = {name: q for name, q in _sent_forms().items() if CALL.search(q)}


@pytest.mark.parametrize("name", sorted(FUNCTION_QUERIES))
def test_called_function_resolves_with_the_sent_types(conn: psycopg.Connection[Any],
                                                      name: str) -> None:
    fn, sent = sent_types(FUNCTION_QUERIES[name])
    declared = conn.execute("""
        SELECT a.name, format_type(a.type, NULL), a.ord > p.pronargs - p.pronargdefaults
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace,
             unnest(p.proargnames, p.proargtypes::oid[]) WITH ORDINALITY AS a(name, type, ord)
        WHERE n.nspname = 'replaysafe' AND p.proname = %s
          AND a.ord <= p.pronargs  -- input arguments only (RETURNS TABLE adds OUT names)
        ORDER BY a.ord""", (fn,)).fetchall()
    assert declared, f"replaysafe.{fn} does not exist"
    declared_names = [d[0] for d in declared]
    assert set(sent) <= set(declared_names), f"{fn}: unknown arguments {set(sent) - set(declared_names)}"
    signature = []
    for arg, declared_type, has_default in declared:
        if arg in sent:
            got = conn.execute("SELECT %s::regtype::text", (sent[arg],)).fetchone()
            assert got is not None
            assert got[0] == declared_type, f"{fn}.{arg}: sends {got[0]}, declared {declared_type}"
            signature.append(got[0])
        else:
            assert has_default, f"{fn}.{arg} has no default and is not sent"
            signature.append(declared_type)
    regproc = f"replaysafe.{fn}({', '.join(signature)})"
    assert conn.execute("SELECT to_regprocedure(%s)", (regproc,)).fetchone() != (None,), regproc


@pytest.mark.parametrize("name", sorted(_sent_forms()))
def test_every_query_plans_with_driver_parameters(conn: psycopg.Connection[Any], name: str) -> None:
    """EXPLAIN with NULL parameters, sent the way the driver sends them: resolution and
    planning happen, the (volatile) functions do not run."""
    query = _sent_forms()[name]
    name = name.removesuffix(DEFAULTED)
    if not query.startswith("SELECT"):
        # Utility statements (LISTEN/UNLISTEN) cannot be EXPLAINed: run them for real.
        assert query.split()[0] in ("LISTEN", "UNLISTEN"), query
        conn.execute(query)
        return
    params = {p: None for p, _ in PARAM.findall(query)}
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (VERBOSE) " + query, params).fetchall()
    text = "\n".join(r[0] for r in plan)
    if name in FUNCTION_QUERIES and f"replaysafe.{name}(" not in text:
        # A LANGUAGE sql function is inlined into the query: its body shows, not its name.
        lang = conn.execute(
            "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'replaysafe' AND p.proname = %s", (name,)).fetchone()
        assert lang == ("sql",), f"{name}: not called and not an inlined SQL function"
        assert "replaysafe." in text or "Index" in text, text


def test_view_queries_return_the_model_fields(conn: psycopg.Connection[Any]) -> None:
    for name, model in (("get_action", Action), ("list_attempts", Attempt)):
        cur = conn.execute(queries.get(name), {"tenant_id": "t", "action_key": "k"})
        assert cur.description is not None
        assert [c.name for c in cur.description] == [f.name for f in dataclasses.fields(model)]


def test_claim_record_matches_claim(conn: psycopg.Connection[Any]) -> None:
    attrs = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'replaysafe.claim_record'::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")]
    names = [f.name for f in dataclasses.fields(Claim)]
    # The record's 9 columns, in order; the key the claim is for is the driver's own.
    assert attrs == names[:-1] and names[-1] == "action_key"


def test_sql_enum_equals_python_enum(conn: psycopg.Connection[Any]) -> None:
    labels = conn.execute("SELECT enum_range(NULL::replaysafe.action_state)::text[]").fetchone()
    assert labels is not None
    assert labels[0] == [s.value for s in ActionState]


@pytest.mark.parametrize("code", sorted(errors.BY_SQLSTATE))
def test_every_rs_sqlstate_maps_to_its_class(conn: psycopg.Connection[Any], code: str) -> None:
    detail = '{"thread_id": "th", "expected_version": 1, "current_version": 2}'
    with pytest.raises(errors.ReplaysafeError) as info, errors.wrap_errors():
        conn.execute("SELECT replaysafe._raise(%s, 'boom', %s)", (code, detail))
    exc = info.value
    assert type(exc) is errors.BY_SQLSTATE[code]
    assert (exc.sqlstate, exc.message, exc.detail) == (code, "boom", detail)
    if code == "RS003":
        assert isinstance(exc, errors.StaleStateError)
        assert (exc.thread_id, exc.expected_version, exc.current_version) == ("th", 1, 2)


ids = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
              min_size=1, max_size=40)


def claimed_key(conn: psycopg.Connection[Any], tenant: str, key: str) -> str:
    with conn.transaction(force_rollback=True):
        row = conn.execute("SELECT idempotency_key FROM replaysafe.claim_action(%s, %s, 'op', "
                           "'{}', 'w')", (tenant, key)).fetchone()
    assert row is not None
    derived: str = row[0]
    return derived


def owner_key(conn: psycopg.Connection[Any], tenant: str, key: str) -> str:
    row = conn.execute("SELECT replaysafe.idempotency_key(%s, %s)", (tenant, key)).fetchone()
    assert row is not None
    derived: str = row[0]
    return derived


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tenant=ids, key=ids)
def test_a_claim_answers_the_key_the_database_derives(conn: psycopg.Connection[Any], tenant: str,
                                                      key: str) -> None:
    assert claimed_key(conn, tenant, key) == owner_key(conn, tenant, key)


@pytest.mark.parametrize(("tenant", "key"), [("t1", "k"), ("\u00df", "\u043a\u043b\u044e\u0447"),
                                             ("\U0001f980", "\U0001d518"), ("a:b", "c")])
def test_idempotency_key_examples(conn: psycopg.Connection[Any], tenant: str, key: str) -> None:
    derived = claimed_key(conn, tenant, key)
    assert derived == owner_key(conn, tenant, key)
    assert derived != owner_key(conn, tenant + "x", key) != owner_key(conn, tenant, key + "x")


def test_every_query_is_loaded_and_calls_are_bare_selects() -> None:
    names = set(queries.all_queries())
    assert {"claim_action", "claim_actions", "heartbeat_action", "complete_action", "fail_action",
            "mark_action_unknown", "resolve_action", "sweep_expired_actions", "purge_actions",
            "get_action", "list_attempts"} <= names
    for name, q in FUNCTION_QUERIES.items():
        assert "\n" not in q and q.startswith("SELECT "), name
        assert CALL.search(q).group(1) == name.removesuffix(DEFAULTED), name  # type: ignore[union-attr]
