"""sql/citus.sql without a database: the revision it was written for, and the
Citus signatures it cites (the ones the stand-ins of tests/helpers/citus.py implement)."""

from __future__ import annotations

import re

from helpers.citus import STANDINS

from replaysafe_pg import schema


def _params(text: str, function: str) -> list[str]:
    """The parameter list of ``function`` in ``text`` (a signature or a CREATE FUNCTION),
    whitespace collapsed, the ``--`` comments of the citing header removed."""
    text = re.sub(r"^\s*--", " ", text, flags=re.M)
    match = re.search(rf"{function}\((.*?)\)\s*(?:RETURNS|--|$)", text, re.S | re.M)
    assert match is not None, function
    body = re.sub(r"\s+", " ", match.group(1)).strip()
    return [p.strip() for p in body.split(",")]


def test_the_script_is_for_the_head_revision() -> None:
    """A new revision must be read against citus.sql (it replaces _caller and _reader, it
    classifies every table) before a Citus installation may take it: until then the guard
    refuses it, and this test fails."""
    guard = schema.citus_sql().split("-- guard: begin --")[1]
    assert "IF v_revision IS DISTINCT FROM v_written_for THEN" in guard
    assert schema.head_revision() == schema.citus_revision()


def test_the_cited_signatures_are_the_stand_ins() -> None:
    header = schema.citus_sql().split("SELECT pg_catalog.set_config")[0]
    for function in ("create_distributed_table", "create_reference_table",
                     "create_distributed_function", "run_command_on_workers"):
        cited = _params(header, function)
        standin = _params(f"{function}(" + STANDINS.split(f"pg_catalog.{function}(", 1)[1], function)
        assert [p.replace("DEFAULT", "default") for p in cited] == \
               [p.replace("DEFAULT", "default") for p in standin], function
