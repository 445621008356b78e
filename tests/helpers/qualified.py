"""Does a statement name the schema of every type, function and operator it uses?

The driver's and the command line's statements run on a session whose search_path is the
login's default (``"$user", public``), where a hostile role may have planted objects: an
overload there with exact argument types (``public.cardinality(text[])``, an ``=`` on an enum
or on text) beats the polymorphic built-in and runs with the caller's rights. So each cast
names ``pg_catalog`` or ``replaysafe``, each call a schema, each operator is written
``OPERATOR(pg_catalog.X)``, and the constructs that look an operator up implicitly (``IN``,
``BETWEEN``, ``LIKE``, ``NULLIF``, ``IS DISTINCT FROM``, a simple ``CASE``) are not used.

A small lexer, not a parser: comments, string literals, quoted identifiers and psycopg
placeholders are single tokens, never looked into. It errs on the side of reporting.
"""

from __future__ import annotations

import re
from typing import NamedTuple

SCHEMAS = {"pg_catalog", "replaysafe"}
_TOKEN = re.compile(r"""
    (?P<skip>\s+|--[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^']|'')*'|\$(?P<tag>[A-Za-z_]\w*|)\$.*?\$(?P=tag)\$)
  | (?P<param>%\(\w+\)[sbt])
  | (?P<name>"(?:[^"]|"")*")
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<number>\d+(?:\.\d*)?)
  | (?P<op>[-+*/<>=~!@\#%^&|`?]+)
  | (?P<punct>::|[(),.;:\[\]])
""", re.VERBOSE | re.DOTALL)
# SQL syntax that a parenthesis may follow without being a function call (COALESCE,
# GREATEST and LEAST compare with the type's default operator class, not by name).
_BEFORE_PAREN = {"SELECT", "FROM", "JOIN", "LATERAL", "WHERE", "ON", "USING", "AND", "OR", "NOT",
                 "EXISTS", "ANY", "ALL", "SOME", "VALUES", "ARRAY", "COALESCE", "GREATEST",
                 "LEAST", "OVER", "FILTER", "WHEN", "THEN", "ELSE", "AS", "BY", "LIMIT", "OFFSET",
                 "UNION"}
# Keywords a string literal may follow (any other word before one makes a typed literal).
_BEFORE_STRING = {"SELECT", "WHEN", "THEN", "ELSE", "AND", "OR", "NOT", "ON", "WHERE", "BY"}
# Each looks up an operator (=, <=, ~~) through the search_path.
_IMPLICIT_OPERATOR = {"IN", "BETWEEN", "LIKE", "ILIKE", "SIMILAR", "NULLIF"}


class Token(NamedTuple):
    kind: str  # skip, string, param, name (quoted identifier), word, number, op, punct
    text: str
    at: int

    def keyword(self) -> str:
        """The word in upper case ("" for any other token: a quoted name is no keyword)."""
        return self.text.upper() if self.kind == "word" else ""


def tokens(sql: str) -> list[Token]:
    found, at = [], 0
    while at < len(sql):
        m = _TOKEN.match(sql, at)
        if m is None:
            raise ValueError(f"cannot read the SQL at {at}: {sql[at:at + 20]!r}")
        kind = m.lastgroup  # the outermost group that matched (a dollar quote's: string)
        assert kind is not None
        if kind != "skip":
            found.append(Token(kind, m.group(), at))
        at = m.end()
    return found


_END = Token("punct", "", -1)


def _at(toks: list[Token], i: int) -> Token:
    return toks[i] if 0 <= i < len(toks) else _END


def _qualifier(toks: list[Token], i: int) -> str | None:
    """The schema that qualifies the name at ``i`` (None: not qualified)."""
    if _at(toks, i - 1).text == "." and _at(toks, i - 2).kind in ("word", "name"):
        return toks[i - 2].text.lower()
    return None


def unqualified(sql: str) -> list[str]:
    """What in ``sql`` may resolve through the caller's search_path, one line each."""
    toks = tokens(sql)
    findings: list[str] = []
    operators: set[int] = set()  # the operators written OPERATOR(pg_catalog.X)

    def report(i: int, what: str) -> None:
        at = toks[i].at
        findings.append(f"{what} at {at}: ...{sql[max(0, at - 30):at + 30]}...")

    for i, tok in enumerate(toks):
        prev, nxt = _at(toks, i - 1), _at(toks, i + 1)
        word = tok.keyword()
        if tok.text == "::" and not (nxt.text.lower() in SCHEMAS and _at(toks, i + 2).text == "."):
            report(i, "a cast to a type of no schema")
        elif word in _IMPLICIT_OPERATOR:
            report(i, f"{word} (an implicit operator)")
        elif word == "DISTINCT" and (prev.keyword() == "IS" or (
                prev.keyword() == "NOT" and _at(toks, i - 2).keyword() == "IS")):
            report(i, "IS DISTINCT FROM (an implicit operator)")
        elif word == "CASE" and nxt.keyword() != "WHEN":
            report(i, "a simple CASE (an implicit operator)")
        elif word == "OPERATOR" and nxt.text == "(":
            if _at(toks, i + 2).text.lower() == "pg_catalog" and _at(toks, i + 3).text == "." \
                    and _at(toks, i + 4).kind == "op" and _at(toks, i + 5).text == ")":
                operators.add(i + 4)
            else:
                report(i, "an operator not of pg_catalog")
        elif word in ("FROM", "JOIN") and prev.keyword() != "DISTINCT" \
                and nxt.text != "(" and nxt.keyword() != "LATERAL" \
                and _at(toks, i + 2).text != ".":
            report(i, "a relation of no schema")
        elif tok.kind in ("word", "name") and nxt.text == "(":
            schema = _qualifier(toks, i)
            if schema is not None and schema not in SCHEMAS:
                report(i, f"a function of schema {schema}")
            elif schema is None and word not in _BEFORE_PAREN and prev.keyword() != "AS":
                report(i, "a function of no schema")
        elif tok.kind in ("word", "name") and nxt.kind == "string" \
                and _qualifier(toks, i) is None and word not in _BEFORE_STRING:
            report(i, "a typed literal of no schema")
        elif tok.kind == "op" and i not in operators and tok.text != "=>" \
                and not (tok.text == "*" and (prev.text in (".", "(") or prev.keyword() == "SELECT")):
            report(i, f"the operator {tok.text}")
    return findings
