"""Stable, unambiguous action keys and the derived idempotency key."""

from __future__ import annotations

import hashlib

from replaysafe_pg.errors import InvalidArgument


def _part(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string")
    return value


def tool_call_key(thread_id: str, message_id: str, tool_call_id: str) -> str:
    """Key of one tool call of one assistant message in one thread.

    Each part is length-prefixed, so no two different triples give the same key even when
    the parts themselves contain the separator (``"a:b", "c"`` vs ``"a", "b:c"``).
    """
    parts = (_part(thread_id, "thread_id"), _part(message_id, "message_id"),
             _part(tool_call_id, "tool_call_id"))
    key = "tc:" + ":".join(f"{len(p)}.{p}" for p in parts)
    if len(key) > 512:
        # Keep within the 512-character id limit, still unambiguous and stable.
        key = "tc#" + hashlib.sha256(key.encode()).hexdigest()
    return key


def idempotency_key(tenant_id: str, action_key: str) -> str:
    """The key ``replaysafe.idempotency_key()`` derives in SQL (a test keeps them equal)."""
    material = f"{len(tenant_id)}:{tenant_id}{action_key}".encode()
    return "rs1_" + hashlib.sha256(material).hexdigest()
