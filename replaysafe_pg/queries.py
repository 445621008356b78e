"""The driver's SQL, loaded once from ``sql/queries.sql`` (split at ``-- name: ... --``).

Two arguments are optional in every query that has them: the caller's clock
(``, p_now => %(now)s::pg_catalog.timestamptz``) and a tenant grant
(``, p_grant => %(grant)s::pg_catalog.text``). The loader derives the forms without them, and
:func:`get` picks the form from the parameters: each is sent only when the caller gave it
(not None). Without ``now`` the function's default (the moment of the call) applies — never
the start of a transaction, and never a client clock; without a grant, the statement is the
one a bound login has always sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, LiteralString, cast

from replaysafe_pg._paths import sql_dir

_MARKER = re.compile(r"^-- name: (\w+) --$", re.MULTILINE)
# How a query passes the caller's clock and a grant; each is removed whole to leave the
# function's default in force.
NOW_ARGUMENT = ", p_now => %(now)s::pg_catalog.timestamptz"
GRANT_ARGUMENT = ", p_grant => %(grant)s::pg_catalog.text"
_NOW_WORD = re.compile(r"\b(p_now|now)\b")


def parse(text: str) -> dict[str, LiteralString]:
    parts = _MARKER.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
        # Loaded from our own file, never from input: safe to treat as a literal.
        queries[name] = cast(LiteralString, "\n".join(lines).strip())  # type: ignore[redundant-cast]
    return queries


def without_now(query: LiteralString) -> LiteralString:
    """``query`` without its ``p_now`` argument (unchanged if it has none)."""
    rest = query.replace(NOW_ARGUMENT, "", 1)
    if _NOW_WORD.search(rest):
        raise ValueError(f"a query passes the time other than as {NOW_ARGUMENT!r}: {query}")
    return cast(LiteralString, rest)  # type: ignore[redundant-cast]


@cache
def all_queries() -> dict[str, LiteralString]:
    """Every query as written in the file (time-sensitive ones with their ``p_now``)."""
    return parse((sql_dir() / "queries.sql").read_text(encoding="utf-8"))


def _without(query: LiteralString, now: bool, grant: bool) -> LiteralString:
    if not now:
        query = without_now(query)
    if not grant:
        query = cast(LiteralString, query.replace(GRANT_ARGUMENT, "", 1))  # type: ignore[redundant-cast]
    return query


@cache
def _forms() -> dict[tuple[str, bool, bool], LiteralString]:
    """Every query in each form: (name, sends p_now, sends p_grant)."""
    return {(name, now, grant): _without(q, now, grant)
            for name, q in all_queries().items() for now in (False, True) for grant in (False, True)}


def takes_now(name: str) -> bool:
    return NOW_ARGUMENT in all_queries()[name]


def takes_grant(name: str) -> bool:
    return GRANT_ARGUMENT in all_queries()[name]


def get(name: str, params: Mapping[str, Any] | None = None) -> LiteralString:
    """The query ``name`` to send with ``params``: the one place that decides whether
    ``p_now`` and ``p_grant`` are sent (each only when ``params`` carry it, not None)."""
    if params is None:
        return _forms()[name, False, False]
    return _forms()[name, params.get("now") is not None, params.get("grant") is not None]


@cache
def _file(filename: str) -> dict[str, LiteralString]:
    return parse((sql_dir() / filename).read_text(encoding="utf-8"))


def cli(name: str) -> LiteralString:
    """A query of the command line (``sql/cli.sql``)."""
    return _file("cli.sql")[name]
