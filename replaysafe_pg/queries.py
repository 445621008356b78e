"""The driver's SQL, loaded once from ``sql/queries.sql`` (split at ``-- name: ... --``).

Time-sensitive queries end their call with ``, p_now => %(now)s::pg_catalog.timestamptz``.
The loader derives a second form without that argument, and :func:`get` picks the form from
the parameters: ``p_now`` is sent only when the caller gave a ``now``; otherwise it is left
out and the function's default (the moment of the call) applies — never the start of a
transaction, and never a client clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, LiteralString, cast

from replaysafe_pg._paths import sql_dir

_MARKER = re.compile(r"^-- name: (\w+) --$", re.MULTILINE)
# How a query passes the caller's clock; it is removed whole to leave the default in force.
NOW_ARGUMENT = ", p_now => %(now)s::pg_catalog.timestamptz"
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


@cache
def _defaulted() -> dict[str, LiteralString]:
    return {name: without_now(q) for name, q in all_queries().items() if NOW_ARGUMENT in q}


def takes_now(name: str) -> bool:
    return name in _defaulted()


def get(name: str, params: Mapping[str, Any] | None = None) -> LiteralString:
    """The query ``name`` to send with ``params``: the one place that decides whether
    ``p_now`` is sent (only when ``params`` carry a ``now`` that is not None)."""
    if params is not None and params.get("now") is not None:
        return all_queries()[name]
    return _defaulted().get(name) or all_queries()[name]


@cache
def _file(filename: str) -> dict[str, LiteralString]:
    return parse((sql_dir() / filename).read_text(encoding="utf-8"))


def cli(name: str) -> LiteralString:
    """A query of the command line (``sql/cli.sql``)."""
    return _file("cli.sql")[name]
