"""Tenant grants (SPEC §4) over plain SQL, for the sql tier's tests: issuing them, taking
them apart and altering them (still well-formed, so a refusal is about validity, not
shape), and the schema owner's view of every table a refused call must leave alone.

Deliberately independent of the Python driver's grant support: these tests talk SQL."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import psycopg
from psycopg import sql

B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
# The last character of a 43-character base64url spelling of 32 bytes carries two zero bits.
CANONICAL_LAST = "AEIMQUYcgkosw048"
# What sql/functions/tenant_grants.sql accepts as the shape of a grant (else RS005).
SHAPE = re.compile(r"\A[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]\Z")

# Every table a call made for a tenant may write (and the grant machinery's own).
WATCHED = ("actions", "action_attempts", "threads", "thread_versions",
           "langgraph_checkpoints", "langgraph_blobs", "langgraph_writes",
           "langgraph_namespaces", "langgraph_thread_users",
           "grant_generations", "grant_keys", "role_bindings")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parts(grant: str) -> tuple[str, str, str]:
    header, claims, signature = grant.split(".")
    return header, claims, signature


def claims_of(grant: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(unb64url(parts(grant)[1]))
    return out


def header_of(grant: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(unb64url(parts(grant)[0]))
    return out


def with_part(grant: str, index: int, new: str) -> str:
    p = list(parts(grant))
    p[index] = new
    return ".".join(p)


def with_claims(grant: str, **changes: Any) -> str:
    """The grant with its claims re-encoded with ``changes`` (its signature kept)."""
    claims = claims_of(grant)
    claims.update(changes)
    return with_part(grant, 1, b64url(json.dumps(claims).encode()))


def flip(text: str, pos: int, alphabet: str = B64URL) -> str:
    """``text`` with the character at ``pos`` replaced by the next one of ``alphabet``."""
    old = text[pos]
    new = alphabet[(alphabet.index(old) + 1) % len(alphabet)] if old in alphabet else alphabet[0]
    assert new != old
    return text[:pos] + new + text[pos + 1:]


def issue(conn: psycopg.Connection[Any], tenant: str, *, ttl: str | None = None,
          user: str | None = None, duties: list[str] | None = None) -> str:
    """``replaysafe.issue_tenant_grant`` on ``conn`` (an issuer's, or the owner's)."""
    args = [sql.SQL("p_tenant_id => {}").format(sql.Placeholder("tenant"))]
    if ttl is not None:
        args.append(sql.SQL("p_ttl => {}::interval").format(sql.Placeholder("ttl")))
    if user is not None:
        args.append(sql.SQL("p_user_id => {}").format(sql.Placeholder("user")))
    if duties is not None:
        args.append(sql.SQL("p_duties => {}::text[]").format(sql.Placeholder("duties")))
    row = conn.execute(sql.SQL("SELECT replaysafe.issue_tenant_grant({})").format(
        sql.SQL(", ").join(args)), {"tenant": tenant, "ttl": ttl, "user": user,
                                    "duties": duties}).fetchone()
    assert row is not None and isinstance(row[0], str), row
    assert SHAPE.match(row[0]), row[0]
    grant: str = row[0]
    return grant


def sqlstate_of(conn: psycopg.Connection[Any], query: str | sql.SQL | sql.Composed,
                params: Any = None) -> str | None:
    """The SQLSTATE ``query`` raises, or None when it succeeds (on an autocommit connection;
    in an open transaction the caller rolls back)."""
    try:
        conn.execute(query.encode() if isinstance(query, str) else query, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def table_state(dsn: str) -> dict[str, tuple[int, str]]:
    """Per watched table: its row count and a digest of every row, read as the schema owner
    (the DSN's own role): an update in place changes the digest, not only an insert."""
    out: dict[str, tuple[int, str]] = {}
    with psycopg.connect(dsn, autocommit=True) as c:
        for table in WATCHED:
            row = c.execute(sql.SQL(
                "SELECT count(*), md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) "
                "FROM replaysafe.{} t").format(sql.Identifier(table))).fetchone()
            assert row is not None
            out[table] = (int(row[0]), str(row[1]))
    return out
