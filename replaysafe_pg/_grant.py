"""Tenant grants on the client side: their shape, their claims read without verifying, and
the grant a driver object sends with each statement (docs/isolation.md#tenant-grants).

The database is the only judge of a grant (signature, installation, expiry, revocation); the
driver reads the claims only to know the tenant (and user) a grant is for, so that a driver
object made with ``grant=`` and no ``tenant_id`` acts for the grant's tenant, and a
mismatch is refused before anything is sent. A grant is a credential: it never appears in
an error message or a repr.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

from replaysafe_pg._args import text_id
from replaysafe_pg.errors import InvalidArgument

# sql/functions/tenant_grants.sql (_acts_with_grant): three base64url parts, the last one a
# canonical 32-byte HMAC-SHA256 (43 characters, the last carrying two zero bits), at most
# 2 KiB in all.
MAX_GRANT_BYTES = 2048
_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]",
                    re.ASCII)
DUTIES = ("worker", "operator", "auditor")

# What ``grant=`` takes: the grant itself, or a zero-argument callable returning the current
# one (asked before each statement, so that a long-lived object can be handed fresh grants).
GrantArg: TypeAlias = "str | Callable[[], str]"


@dataclass(frozen=True, slots=True)
class GrantClaims:
    """What a grant says, as read by the client (never verified here: the database does)."""

    tenant_id: str
    user_id: str | None
    duties: tuple[str, ...]
    issued_at: datetime
    expires_at: datetime
    generation: int


def _not_a_grant(why: str) -> InvalidArgument:
    return InvalidArgument(f"grant is not a tenant grant ({why}; "
                           "replaysafe.issue_tenant_grant or replaysafe_pg.issue_grant makes them)")


def check_shape(grant: Any) -> str:
    """``grant`` if it has a grant's shape (a str of three base64url parts, at most 2 KiB)."""
    if not isinstance(grant, str):
        raise InvalidArgument(f"grant must be a str (or a callable returning one), "
                              f"not {type(grant).__name__}")
    if len(grant) > MAX_GRANT_BYTES or not grant.isascii() or _SHAPE.fullmatch(grant) is None:
        raise _not_a_grant(f"a grant is three base64url parts of at most {MAX_GRANT_BYTES} bytes")
    return grant


def _moment(value: Any, what: str) -> datetime:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _not_a_grant(f"its {what} is not a number")
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        raise _not_a_grant(f"its {what} is out of range") from None


def read_claims(grant: Any) -> GrantClaims:
    """The claims of ``grant``, read without verifying its signature (the database verifies
    it at every call). :class:`InvalidArgument` when it is not shaped like a grant."""
    body = check_shape(grant).split(".")[1]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        claims = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError):
        raise _not_a_grant("its claims are not base64url JSON") from None
    if not isinstance(claims, dict):
        raise _not_a_grant("its claims are not a JSON object")
    tenant_id, user_id, duties = claims.get("tid"), claims.get("sub"), claims.get("dut", [])
    if not isinstance(tenant_id, str) or not tenant_id:
        raise _not_a_grant("it names no tenant")
    if user_id is not None and not isinstance(user_id, str):
        raise _not_a_grant("its user is not text")
    if not isinstance(duties, list) or not all(isinstance(d, str) for d in duties):
        raise _not_a_grant("its duties are not a list of names")
    generation = claims.get("gen", 0)
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise _not_a_grant("its generation is not an integer")
    return GrantClaims(tenant_id=tenant_id, user_id=user_id, duties=tuple(duties),
                       issued_at=_moment(claims.get("iat"), "issue time"),
                       expires_at=_moment(claims.get("exp"), "expiry"), generation=generation)


class Grant:
    """The grant one driver object sends: a fixed string, or a callable asked for the current
    one before each statement. Every grant it hands out has a grant's shape and is for the
    object's tenant (:class:`InvalidArgument` otherwise, before anything is sent); the first
    is asked for when the object is made."""

    __slots__ = ("_last", "_provider", "tenant_id", "user_id")

    def __init__(self, grant: Any, tenant_id: str | None) -> None:
        if isinstance(grant, str):
            self._provider: Callable[[], str] | None = None
            first = grant
        elif callable(grant):
            self._provider = grant
            first = grant()
        else:
            raise InvalidArgument(f"grant must be a str or a callable returning one, "
                                  f"not {type(grant).__name__}")
        claims = read_claims(first)
        if tenant_id is not None and text_id(tenant_id, "tenant_id") != claims.tenant_id:
            raise InvalidArgument(
                f"tenant_id is {tenant_id!r}, but the grant is for tenant {claims.tenant_id!r} "
                "(omit tenant_id to act for the grant's tenant)")
        self.tenant_id = claims.tenant_id
        # The grant's user when the object was made (a refreshed grant may name another:
        # the database rules on each call).
        self.user_id = claims.user_id
        self._last = first

    def current(self) -> str:
        """The grant to send with the next statement."""
        provider = self._provider
        if provider is None:
            return self._last
        grant = provider()
        if grant is not self._last and grant != self._last:
            claims = read_claims(grant)
            if claims.tenant_id != self.tenant_id:
                raise InvalidArgument(
                    f"the grant callable returned a grant for tenant {claims.tenant_id!r}, but "
                    f"this object acts for tenant {self.tenant_id!r}: nothing was sent")
            self._last = grant
        return grant

    def __repr__(self) -> str:  # never the grant itself
        kind = "callable" if self._provider is not None else "fixed"
        return f"<Grant ({kind}) for tenant {self.tenant_id!r}>"


def grant_of(grant: Any, tenant_id: str | None) -> Grant | None:
    """``grant=`` of a driver object as a :class:`Grant` (None: no grant)."""
    return None if grant is None else Grant(grant, tenant_id)


def tenant_of(tenant_id: str | None, grant: Grant | None) -> str:
    """The tenant a driver object acts for: ``tenant_id``, else the grant's, else
    ``"default"``."""
    if tenant_id is not None:
        return tenant_id
    return grant.tenant_id if grant is not None else "default"
