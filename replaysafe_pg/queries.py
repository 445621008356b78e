"""The driver's SQL, loaded once from ``sql/queries.sql`` (split at ``-- name: ... --``)."""

from __future__ import annotations

import re
from functools import cache
from typing import LiteralString, cast

from replaysafe_pg._paths import sql_dir

_MARKER = re.compile(r"^-- name: (\w+) --$", re.MULTILINE)


def parse(text: str) -> dict[str, LiteralString]:
    parts = _MARKER.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
        # Loaded from our own file, never from input: safe to treat as a literal.
        queries[name] = cast(LiteralString, "\n".join(lines).strip())  # type: ignore[redundant-cast]
    return queries


@cache
def all_queries() -> dict[str, LiteralString]:
    return parse((sql_dir() / "queries.sql").read_text(encoding="utf-8"))


def get(name: str) -> LiteralString:
    return all_queries()[name]


@cache
def _file(filename: str) -> dict[str, LiteralString]:
    return parse((sql_dir() / filename).read_text(encoding="utf-8"))


def cli(name: str) -> LiteralString:
    """A query of the command line (``sql/cli.sql``)."""
    return _file("cli.sql")[name]
