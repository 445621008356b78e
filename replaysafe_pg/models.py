"""Values the driver returns: enums mirror the SQL ones (a test keeps them equal)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from replaysafe_pg.errors import SchemaNotInstalled


class ActionState(enum.StrEnum):
    """``replaysafe.action_state``."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYABLE = "retryable"
    UNKNOWN = "unknown"


class ClaimOutcome(enum.StrEnum):
    CLAIMED = "claimed"
    REPLAY = "replay"
    RUNNING = "running"
    UNKNOWN = "unknown"


class ReportOutcome(enum.StrEnum):
    RECORDED = "recorded"
    LATE = "late"
    SUPERSEDED = "superseded"


_CLAIM_OUTCOMES: dict[str, ClaimOutcome] = {m.value: m for m in ClaimOutcome}
_STATES: dict[str, ActionState] = {m.value: m for m in ActionState}


@dataclass(frozen=True, slots=True)
class Claim:
    """What ``claim_action`` answered, for ``action_key``. A ``claimed`` answer carries the
    attempt's token, its capability: pass the claim itself to ``heartbeat``, ``complete``,
    ``fail`` and ``mark_unknown`` (the token is never shown by ``repr``)."""

    outcome: ClaimOutcome
    state: ActionState
    attempt: int
    lease_expires_at: datetime | None
    result: Any
    error: Any
    idempotency_key: str
    provider_reference: str | None
    attempt_token: str | None = field(default=None, repr=False)
    action_key: str = ""

    @classmethod
    def from_row(cls, row: tuple[Any, ...], action_key: str = "") -> Claim:
        if len(row) < 9:  # a schema older than attempt tokens answers eight columns
            raise SchemaNotInstalled(
                "the replaysafe schema is older than this driver (its claims carry no attempt "
                "token): migrate it (replaysafe-pg migrate)")
        # A dict lookup, not the Enum call: a replay's whole decoding is this line.
        return cls(_CLAIM_OUTCOMES[row[0]], _STATES[row[1]], row[2], row[3], row[4], row[5],
                   row[6], row[7], row[8], action_key)


@dataclass(frozen=True, slots=True)
class AttemptToken:
    """An attempt's capability apart from the :class:`Claim` that carried it (a worker that
    received the claim from another process, say): pass it where a claim is taken. The
    token is never shown by ``repr``."""

    action_key: str
    attempt: int
    attempt_token: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Action:
    """One row of ``replaysafe.actions_v``."""

    tenant_id: str
    action_key: str
    thread_id: str | None
    operation: str
    state: ActionState
    attempt: int
    on_expired: str
    idempotency_key: str
    request: Any
    result: Any
    error: Any
    provider_reference: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    worker_id: str
    resolution_note: str | None
    resolved_at: datetime | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Action:
        values = list(row)
        values[4] = ActionState(values[4])
        return cls(*values)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One row of ``replaysafe.action_attempts_v``."""

    tenant_id: str
    action_key: str
    attempt: int
    worker_id: str
    claimed_at: datetime
    ended_at: datetime | None
    outcome: ActionState | None
    superseded: bool
    error: Any
    result: Any
    provider_reference: str | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Attempt:
        values = list(row)
        if values[6] is not None:
            values[6] = ActionState(values[6])
        return cls(*values)


@dataclass(frozen=True, slots=True)
class ThreadState:
    """What ``read_thread`` answered: ``version`` 0 and ``state`` None when the thread was
    never written; the tombstone's version and ``state`` None after a delete."""

    version: int
    state: dict[str, Any] | None
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class ThreadVersion:
    """One kept version from ``thread_history``."""

    version: int
    state: dict[str, Any]
    created_at: datetime
