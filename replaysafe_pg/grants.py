"""Tenant grants, the issuer's side (docs/isolation.md#tenant-grants).

A pooled login that serves many tenants is bound to none; a signed tenant grant is its
capability instead. The trusted application server (a member of ``replaysafe_issuer``,
never the agent) issues one per tenant, optionally per user, with :func:`issue_grant`, and
hands it to the worker, which passes it as ``grant=`` to ``Ledger``, ``Threads`` or a
LangGraph saver. The database verifies the grant at every call; :func:`read_claims` only
reads what one says (its tenant, user, duties, expiry), without verifying it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from replaysafe_pg import _args, queries
from replaysafe_pg._conn import Conninfo, SyncSource
from replaysafe_pg._grant import DUTIES, MAX_GRANT_BYTES, GrantArg, GrantClaims, read_claims
from replaysafe_pg.errors import InvalidArgument

__all__ = ["DUTIES", "MAX_GRANT_BYTES", "MAX_TTL", "GrantArg", "GrantClaims", "issue_grant",
           "read_claims"]

# sql/functions/tenant_grants.sql: a grant lives at most 7 days.
MAX_TTL = timedelta(days=7)


def _ttl(value: Any) -> timedelta:
    ttl = _args.duration(value, "ttl")
    if ttl <= timedelta(0) or ttl > MAX_TTL:
        raise InvalidArgument(f"ttl must be positive and at most 7 days, got {ttl}")
    return ttl


def _duties(value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument("duties must be a sequence of duty names "
                              f"({', '.join(DUTIES)}), not {type(value).__name__}")
    duties = list(value)
    if not duties or not all(isinstance(d, str) and d in DUTIES for d in duties):
        raise InvalidArgument(f"duties must name one or more of {', '.join(DUTIES)}, "
                              f"got {duties!r}")
    return duties


def issue_params(tenant_id: str, ttl: Any, user_id: str | None,
                 duties: Any) -> dict[str, Any]:
    """The checked parameters of ``issue_tenant_grant`` (nothing is sent)."""
    return {"tenant_id": _args.text_id(tenant_id, "tenant_id"), "ttl": _ttl(ttl),
            "user_id": _args.optional_id(user_id, "user_id"), "duties": _duties(duties)}


def issue_grant(conninfo: Conninfo, tenant_id: str, *, ttl: timedelta | float = timedelta(hours=1),
                user_id: str | None = None, duties: Iterable[str] = ("worker",)) -> str:
    """Issue a tenant grant for ``tenant_id`` (``replaysafe.issue_tenant_grant``): the caller
    is a member of ``replaysafe_issuer`` (or the schema owner).

    ``conninfo``: a DSN, a psycopg connection or a psycopg_pool pool, as for ``Ledger``.
    ``ttl``: how long the grant is valid (a timedelta or seconds; positive, at most 7 days),
    by the database clock. ``user_id``: the user whose threads alone the grant reaches
    (None: the whole tenant's). ``duties``: which of ``worker``, ``operator``, ``auditor``
    the grant gives; the holder acts with those of them its own group roles give too.
    Returns the grant: a secret, to be handed only to the worker that acts for the tenant.
    """
    params = issue_params(tenant_id, ttl, user_id, duties)
    source = SyncSource(conninfo, listen=False)
    try:
        rows = source.execute(queries.get("issue_tenant_grant", params), params)
    finally:
        source.close()
    grant: str = rows[0][0]
    return grant
