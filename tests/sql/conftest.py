"""Fixtures of the sql tier shared across its subdirectories (ledger/, threads/, langgraph/,
isolation/, limits/, citus/); a subdirectory's own in its conftest.py."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as
from helpers.seeded_tenants import seed_claimed_tenants

import replaysafe_pg

Conn = psycopg.Connection[Any]


@pytest.fixture
def worker_a(dsn: str, make_role: Callable[..., str]) -> Iterator[psycopg.Connection[Any]]:
    """A LOGIN role in replaysafe_worker bound to tenant A, connected to the test's database
    (``dsn``). It seeds nothing: a test asks for the world it needs besides (``seeded_world``,
    ``claimed_world`` or its module's own ``world``, each seeding ``dsn``)."""
    role = make_role("replaysafe_worker")
    bind(dsn, role, "A")
    with connect_as(dsn, role) as c:
        yield c


@pytest.fixture
def claimed_world(dsn: str) -> str:
    """Tenants A and B, each with a live claim (token known only to its claimer), a finished
    action, an expired lease, an old finished action, a multi-effect action and a thread
    (helpers.seeded_tenants.seed_claimed_tenants)."""
    seed_claimed_tenants(dsn)
    return dsn


@pytest.fixture
def two_workers(dsn: str, make_role: Callable[..., str]) -> Iterator[tuple[Conn, Conn, Conn]]:
    """Worker 1 and worker 2 of tenant A (LOGIN roles in replaysafe_worker), and a listener."""
    roles = [make_role("replaysafe_worker") for _ in range(2)]
    for role in roles:
        bind(dsn, role, "A")
    with connect_as(dsn, roles[0]) as w1, connect_as(dsn, roles[1]) as w2, \
            psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN replaysafe_actions")
        yield w1, w2, listener


@pytest.fixture
def new_db_at(admin_dsn: str) -> Iterator[Callable[[str], str]]:
    """Make a database migrated up to a revision (an older one, to show what it did); dropped
    after the test."""
    import uuid

    from psycopg import conninfo

    made: list[str] = []

    def make(revision: str) -> str:
        name = f"rs_tok_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        dsn = conninfo.make_conninfo(admin_dsn, dbname=name)
        replaysafe_pg.migrate(dsn, revision)
        return dsn

    yield make
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for name in made:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- a hostile search path: overloads of the built-ins, pg_temp domains of the base types ------

# Concrete stand-ins for polymorphic argument types, so an overload is an exact match.
POLY = {"anyelement": ["text", "integer", "jsonb"], "anycompatible": ["text", "integer", "jsonb"],
        "anynonarray": ["text", "integer"], "any": ["text", "integer", "jsonb", "timestamptz"],
        "anyarray": ["text[]", "jsonb[]", "integer[]"],
        "anycompatiblearray": ["text[]", "jsonb[]", "integer[]"]}


SKIP_TYPES = {"internal", "cstring", "trigger", "event_trigger", "anyrange", "anymultirange",
              "anycompatiblerange", "anycompatiblemultirange", "record", "language_handler"}


# Type names the schema's bodies use that resolve through search_path (integer, bigint,
# boolean and interval are keywords that always mean pg_catalog's): a pg_temp domain of each
# shadows it on an unpinned path.
DOMAIN_TYPES = ("text", "jsonb", "timestamptz", "int4", "int8", "bool", "regrole", "bytea")


def called_names(conn: Conn) -> set[str]:
    """Every function name called in the body of a function or view of the schema, minus
    the schema's own (schema-qualified) ones."""
    bodies = [r[0] for r in conn.execute(
        "SELECT prosrc FROM pg_proc WHERE pronamespace = 'replaysafe'::regnamespace").fetchall()]
    bodies += [r[0] for r in conn.execute(
        "SELECT pg_get_viewdef(c.oid) FROM pg_class c "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind = 'v'").fetchall()]
    names: set[str] = set()
    for body in bodies:
        for m in re.finditer(r"(?<![\w.])([a-z_][a-z0-9_]*)\s*\(", body, re.IGNORECASE):
            names.add(m.group(1).lower())
        for m in re.finditer(r"\bpg_catalog\.([a-z_][a-z0-9_]*)\s*\(", body):
            names.add(m.group(1))
    return names


def overload_signatures(conn: Conn, name: str) -> list[tuple[list[str], str, bool]]:
    """Exact-typed signatures (args, return type, returns set) that shadow the built-ins."""
    rows = conn.execute("""
        SELECT p.proargtypes::regtype[]::text[], p.prorettype::regtype::text, p.proretset,
               p.provariadic <> 0, p.prokind
        FROM pg_proc p WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = %s
          AND p.prokind IN ('f', 'a')""", (name,)).fetchall()
    out: list[tuple[list[str], str, bool]] = []
    for args, ret, retset, variadic, _kind in rows:
        args = [a.strip('"') for a in args]
        if variadic and args and args[-1] in ("any", '"any"'):
            extra = ("text", "integer", "bigint", "timestamptz")
            expansions = [[*args[:-1], *combo] for n in range(4)
                          for combo in itertools.product(extra, repeat=n)]
        else:
            expansions = [list(combo) for combo in itertools.product(*(POLY.get(a, [a]) for a in args))]
        for sig in expansions:
            if any(t in SKIP_TYPES or (t.endswith("[]") and t[:-2] in SKIP_TYPES) for t in sig):
                continue
            r = ret.strip('"')
            if r in POLY:
                r = next((t for t in sig if t not in ("integer",)), "text")
                if ret in ("anyarray", "anycompatiblearray") and not r.endswith("[]"):
                    r = r + "[]"
            if r in SKIP_TYPES or (r == "void" and retset):
                continue
            out.append((sig, r, retset))
    return out


def plant_overloads(attacker: Conn, names: set[str]) -> int:
    attacker.execute("CREATE TABLE public.hijacked (name text, by_role text)")
    attacker.execute("GRANT INSERT, SELECT ON public.hijacked TO PUBLIC")
    planted: set[tuple[str, tuple[str, ...]]] = set()
    for name in sorted(names):
        for args, ret, retset in overload_signatures(attacker, name):
            key = (name, tuple(args))
            if key in planted:
                continue
            planted.add(key)
            result = "RETURN;" if retset or ret == "void" else "RETURN NULL;"
            stmt = (f"CREATE FUNCTION public.{name}({', '.join(args)}) "
                    f"RETURNS {'SETOF ' if retset else ''}{ret} LANGUAGE plpgsql AS $f$ BEGIN "
                    f"INSERT INTO public.hijacked VALUES ('{name}', current_user); {result} END $f$")
            try:
                attacker.execute(stmt)
            except psycopg.Error:
                continue  # e.g. a signature Postgres will not take as written
            attacker.execute(f"GRANT EXECUTE ON FUNCTION public.{name}({', '.join(args)}) TO PUBLIC")
    # Operators the bodies use, exact-typed.
    for typ in ("text", "jsonb", "integer", "bigint", "timestamptz", "bytea"):
        attacker.execute(f"CREATE FUNCTION public.hijack_op(a {typ}, b {typ}) RETURNS boolean "
                         "LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO public.hijacked "
                         "VALUES ('operator', current_user); RETURN true; END $f$")
    for op, typ in (("=", "text"), ("<>", "text"), ("<>", "jsonb"), ("=", "integer"),
                    ("<=", "timestamptz"), (">", "timestamptz"), ("<", "integer"),
                    ("=", "bigint"), ("<>", "bigint"), ("=", "bytea"), ("<>", "bytea")):
        attacker.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {typ}, RIGHTARG = {typ}, "
                         "FUNCTION = public.hijack_op)")
    return len(planted)


def plant_temp_domains(victim: Conn) -> None:
    """The victim's own session shadows the base types with pg_temp domains whose check logs."""
    victim.execute("CREATE FUNCTION pg_temp.hijack_check(v text) RETURNS boolean LANGUAGE sql "
                   "AS $f$ INSERT INTO public.hijacked VALUES ('pg_temp domain', current_user) "
                   "RETURNING true $f$")
    for t in DOMAIN_TYPES:
        victim.execute(f"CREATE DOMAIN pg_temp.{t} AS pg_catalog.{t} "
                       f"CHECK (pg_temp.hijack_check(VALUE::pg_catalog.text))")


@pytest.fixture
def hostile_search_path() -> SimpleNamespace:
    """What an attacker holding a worker's credentials plants to hijack an unpinned function:
    ``called_names(conn)`` (every built-in the schema's bodies call), ``plant_overloads(
    attacker, names)`` (an exact-typed overload of each in public, and of the operators, that
    records in public.hijacked when it runs) and ``plant_temp_domains(victim)`` (pg_temp
    domains shadowing the base types in the victim's own session). Used by
    isolation/test_search_path_pinning.py and langgraph/test_langgraph_sql_isolation.py."""
    return SimpleNamespace(called_names=called_names, plant_overloads=plant_overloads,
                           plant_temp_domains=plant_temp_domains)
