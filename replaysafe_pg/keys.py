"""Stable, unambiguous action keys.

The derived ``idempotency_key`` has no Python helper (docs/isolation.md): the database derives it with
the installation's secret, and a caller gets it only in the answer to its own claim
(``Claim.idempotency_key``, ``Execution.idempotency_key``).
"""

from __future__ import annotations

import hashlib

from replaysafe_pg._args import MAX_ID_BYTES, MAX_ID_CHARS, text
from replaysafe_pg.errors import InvalidArgument


def _part(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string")
    return text(value, what)


def tool_call_key(thread_id: str, message_id: str, tool_call_id: str) -> str:
    """Key of one tool call of one assistant message in one thread.

    Each part is length-prefixed, so no two different triples give the same key even when
    the parts themselves contain the separator (``"a:b", "c"`` vs ``"a", "b:c"``). A key
    over either id limit (512 characters, 1,024 bytes in UTF-8) is replaced by its hash.
    """
    parts = (_part(thread_id, "thread_id"), _part(message_id, "message_id"),
             _part(tool_call_id, "tool_call_id"))
    key = "tc:" + ":".join(f"{len(p)}.{p}" for p in parts)
    encoded = key.encode("utf-8")
    if len(key) > MAX_ID_CHARS or len(encoded) > MAX_ID_BYTES:
        # Still unambiguous and stable; "#" never follows "tc" in the readable form.
        key = "tc#" + hashlib.sha256(encoded).hexdigest()
    return key

