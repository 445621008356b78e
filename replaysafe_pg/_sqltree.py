"""The SQL tree (``sql/``, the desired state by concern) and the function sets built from it.

* ``tables/`` — what only a revision's DDL creates or changes: tables, indexes, row types;
* ``functions/``, ``views/``, ``grants.sql`` — the **function set**: every function, view and
  privilege, written once. After each revision step's DDL the migration runner applies the
  function set of the revision the step arrives at, whole (``CREATE OR REPLACE``): the tree's
  for the head, a frozen snapshot (``migrations/snapshots/NNNN.sql``, written once when the
  revision is released, checksummed in ``migrations/released.sha256``) for a released one.

A function set ends with two checks: the functions of the schema are exactly the ones it
defines (name and argument types: a revision that changes a signature must ``DROP`` the old
one, or the step fails), and every body compiles (bodies are created without validation,
as pg_dump does, because views and functions refer to each other; they are validated
once all exist).
"""

from __future__ import annotations

import re
from pathlib import Path

from replaysafe_pg._paths import migrations_dir, sql_dir

# In the order they are applied. Tables and views depend on what comes before them; the
# functions may come in any order (their bodies are validated after the views exist).
TABLES = ("tables/tenancy.sql", "tables/ledger.sql", "tables/threads.sql", "tables/langgraph.sql")
FUNCTIONS = ("functions/checks.sql", "functions/tenancy.sql", "functions/ledger_claim.sql",
             "functions/ledger_reports.sql", "functions/ledger_operator.sql",
             "functions/tenant_grants.sql", "functions/threads.sql", "functions/langgraph.sql",
             "functions/operability.sql")
VIEWS = ("views/caller.sql", "views/audit.sql")
GRANTS = ("grants.sql",)
# The driver's and the command line's queries, and the Citus script: not part of the schema.
OTHER = ("queries.sql", "cli.sql", "citus.sql")

FUNCTION_SET_PARTS = FUNCTIONS + VIEWS + GRANTS
SCHEMA_PARTS = TABLES + FUNCTION_SET_PARTS


def read(part: str) -> str:
    return (sql_dir() / part).read_text(encoding="utf-8")


# --- the functions a set defines ------------------------------------------------------------

_CREATE_FUNCTION = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION (replaysafe\.\w+)\(", re.M)


def _parameters(sql: str, start: int) -> list[str]:
    """The parameters in the list whose parenthesis is at ``start``: split at its top-level
    commas, up to its closing parenthesis (quotes and nested parentheses respected)."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, None
    for ch in sql[start + 1:]:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                if "".join(current).strip():
                    parts.append("".join(current))
                return parts
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    raise ValueError(f"unbalanced parameter list at offset {start}")


_DEFAULT = re.compile(r"\s(?:DEFAULT\s|=\s).*$", re.S | re.I)
_MODE = re.compile(r"^(?:IN|INOUT|VARIADIC)\s+", re.I)


def _argument_type(parameter: str) -> str | None:
    """``p_lease interval DEFAULT '30 seconds'`` -> ``interval``; None for an OUT parameter
    (not part of the signature). Every parameter in the tree is named."""
    text = " ".join(_DEFAULT.sub("", " " + parameter.strip()).split())
    if re.match(r"^OUT\s", text, re.I):
        return None
    text = _MODE.sub("", text)
    _name, _sep, argtype = text.partition(" ")
    if not argtype:
        raise ValueError(f"parameter without a name or a type: {parameter.strip()!r}")
    return argtype


def signatures(sql: str) -> list[str]:
    """Every function ``sql`` creates, as ``replaysafe.name(type, ...)`` (regprocedure
    input: the database resolves the type names)."""
    found = []
    for match in _CREATE_FUNCTION.finditer(sql):
        params = _parameters(sql, match.end() - 1)
        types = [t for t in (_argument_type(p) for p in params) if t is not None]
        found.append(f"{match.group(1)}({', '.join(types)})")
    return found


# --- the scripts ------------------------------------------------------------------------------

PREAMBLE = """-- Every name below is resolved in pg_catalog first, for the rest of this transaction.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
"""

_FUNCTION_SET_BEGIN = """\
-- replaysafe's function set: every function, view and privilege of the schema
-- (sql/functions, sql/views, sql/grants.sql), applied whole after a revision's DDL.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
SELECT pg_catalog.set_config('replaysafe.outer_check_function_bodies',
                             pg_catalog.current_setting('check_function_bodies'), true);
SELECT pg_catalog.set_config('check_function_bodies', 'off', true);
"""

_FUNCTION_SET_END = """\
-- The functions of the schema are exactly the set's: a signature changed by a revision
-- that did not DROP the old one is refused here, with the whole step.
DO $function_set$
DECLARE
    v_expected pg_catalog.regprocedure[] := ARRAY[
        {signatures}
    ]::pg_catalog.regprocedure[];
    v_left text;
    r record;
BEGIN
    SELECT pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::text, ', '
                                  ORDER BY p.oid::pg_catalog.regprocedure::text) INTO v_left
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace OPERATOR(pg_catalog.=) 'replaysafe'::pg_catalog.regnamespace
      AND p.oid OPERATOR(pg_catalog.<>) ALL (v_expected::pg_catalog.oid[]);
    IF v_left IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42723', MESSAGE = pg_catalog.concat(
            'replaysafe: the schema holds functions its function set does not define: ', v_left,
            ' (a revision that changes a signature drops the old one)');
    END IF;
    -- Every body compiles, now that every function and view exists.
    PERFORM pg_catalog.set_config('check_function_bodies', 'on', true);
    FOR r IN
        SELECT p.oid, l.lanvalidator::pg_catalog.regproc AS validator
        FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
        WHERE p.oid OPERATOR(pg_catalog.=) ANY (v_expected::pg_catalog.oid[])
          AND l.lanvalidator OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('SELECT %s(%s)', r.validator, r.oid);
    END LOOP;
END
$function_set$;
SELECT pg_catalog.set_config('check_function_bodies',
                             pg_catalog.current_setting('replaysafe.outer_check_function_bodies'), true);
"""


def _join(parts: tuple[str, ...]) -> str:
    return "\n".join(read(p).rstrip("\n") + "\n" for p in parts)


def function_set_sql() -> str:
    """The function set of the tree (the head revision's, or an unreleased one's)."""
    body = _join(FUNCTION_SET_PARTS)
    listed = ",\n        ".join(f"'{s}'" for s in signatures(body))
    return (_FUNCTION_SET_BEGIN + "\n" + body + "\n"
            + _FUNCTION_SET_END.replace("{signatures}", listed))


def schema_sql() -> str:
    """The whole current schema as one script: the tables, then the function set."""
    return PREAMBLE + "\n" + _join(TABLES) + "\n" + function_set_sql()


# --- released snapshots -----------------------------------------------------------------------

def snapshot_path(revision: str, directory: Path | None = None) -> Path:
    return (directory or migrations_dir()) / "snapshots" / f"{revision}.sql"


def released(directory: Path | None = None) -> dict[str, str]:
    """``released.sha256``: file (relative to ``migrations/``) -> its sha256."""
    text = ((directory or migrations_dir()) / "released.sha256").read_text(encoding="utf-8")
    rows = [ln.split(None, 1) for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return {name.strip(): digest for digest, name in rows}


def released_revisions(directory: Path | None = None) -> set[str]:
    return {m.group(1) for name in released(directory)
            if (m := re.match(r"versions/(\d{4})_", name))}


def function_set_of(revision: str, head: str) -> str:
    """The function set a step arriving at ``revision`` applies: its frozen snapshot once it
    is released (listed in ``released.sha256``), else — for ``head``, the chain's head, in
    development — the tree's."""
    path = snapshot_path(revision)
    if revision in released_revisions():
        if not path.is_file() or f"snapshots/{revision}.sql" not in released():
            raise RuntimeError(f"replaysafe_pg: revision {revision} is released without a snapshot "
                               f"of its function set ({path}): reinstall the package")
        return path.read_text(encoding="utf-8")
    if revision != head:
        raise RuntimeError(f"replaysafe_pg: revision {revision} is neither released nor the head "
                           f"({head}): only the head revision takes the tree's function set")
    return function_set_sql()
