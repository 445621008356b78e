"""The SQL tree (``sql/``) without a database: every file has its place, every function is
written in exactly one place, and the function set's signature list is read right."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from replaysafe_pg import _sqltree
from replaysafe_pg._paths import sql_dir

DEFINES = re.compile(r"^CREATE (?:OR REPLACE )?(FUNCTION|VIEW|TABLE|TYPE) (replaysafe\.\w+)", re.M)


def test_every_file_of_the_tree_has_its_place() -> None:
    files = {p.relative_to(sql_dir()).as_posix() for p in sql_dir().rglob("*.sql")}
    assert files == set(_sqltree.SCHEMA_PARTS + _sqltree.OTHER)


def test_every_object_is_written_in_exactly_one_place() -> None:
    seen = Counter((kind, name) for part in _sqltree.SCHEMA_PARTS
                   for kind, name in DEFINES.findall(_sqltree.read(part)))
    assert seen and [k for k, n in seen.items() if n > 1] == []
    assert ("FUNCTION", "replaysafe.claim_action") in seen


def test_tables_hold_no_function_and_the_function_set_no_table() -> None:
    for part in _sqltree.TABLES:
        assert not re.search(r"CREATE (OR REPLACE )?(FUNCTION|VIEW)", _sqltree.read(part)), part
    for part in _sqltree.FUNCTION_SET_PARTS:
        text = _sqltree.read(part)
        assert not re.search(r"^(CREATE|ALTER|DROP) (TABLE|INDEX|TYPE)", text, re.M), part
        # Re-applied at every step: nothing but what CREATE OR REPLACE can do again.
        assert not re.search(r"^CREATE (FUNCTION|VIEW)", text, re.M), part


def test_the_citus_script_defines_nothing_the_tree_defines_but_its_binding_lookups() -> None:
    tree = {name for part in _sqltree.SCHEMA_PARTS for _k, name in DEFINES.findall(_sqltree.read(part))}
    citus = {name for _k, name in DEFINES.findall(_sqltree.read("citus.sql"))}
    assert tree & citus == {"replaysafe._caller", "replaysafe._reader", "replaysafe._binding"}


def test_the_function_set_lists_every_function_once() -> None:
    sigs = _sqltree.signatures(_sqltree.function_set_sql())
    assert len(sigs) == len(set(sigs)) == sum(
        len(re.findall(r"^CREATE OR REPLACE FUNCTION", _sqltree.read(p), re.M)) for p in _sqltree.FUNCTIONS)
    assert "replaysafe.bind_role_to_tenant(text, text)" in sigs
    assert "replaysafe._expire_attempt(replaysafe.actions, timestamptz)" in sigs


@pytest.mark.parametrize(("sql", "expected"), [
    ("CREATE OR REPLACE FUNCTION replaysafe.f()\nRETURNS int", ["replaysafe.f()"]),
    ("CREATE OR REPLACE FUNCTION replaysafe.f(\n    p_a text DEFAULT 'a, (b)',\n"
     "    p_b timestamp with time zone DEFAULT clock_timestamp(),\n    p_c text[] = '{x,y}',\n"
     "    OUT o_x integer,\n    VARIADIC p_d double precision[])\nRETURNS int",
     ["replaysafe.f(text, timestamp with time zone, text[], double precision[])"]),
    ("CREATE FUNCTION replaysafe.g(p_x \"char\") RETURNS int;\n"
     "CREATE OR REPLACE FUNCTION replaysafe.h(INOUT p_y bigint) RETURNS bigint",
     ['replaysafe.g("char")', "replaysafe.h(bigint)"]),
])
def test_signatures_are_read_from_the_parameter_lists(sql: str, expected: list[str]) -> None:
    assert _sqltree.signatures(sql) == expected


def test_an_unnamed_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="without a name"):
        _sqltree.signatures("CREATE OR REPLACE FUNCTION replaysafe.f(text) RETURNS int")
