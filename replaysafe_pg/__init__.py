"""replaysafe_pg: replay-safe side effects for AI agents, enforced in Postgres."""

from typing import TYPE_CHECKING, Any

from replaysafe_pg.errors import (
    AccessDenied,
    ActionNotSucceeded,
    CitusUnavailable,
    DatabaseUnavailable,
    FingerprintConflict,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    LoginRefused,
    OutcomeNotRecorded,
    ReplaysafeError,
    SchemaNotInstalled,
    StaleStateError,
    UnstorableResult,
)
from replaysafe_pg.execution import Call, Execution, ExecutionStatus
from replaysafe_pg.grants import GrantClaims, issue_grant, read_claims
from replaysafe_pg.ledger import AsyncLedger, Ledger
from replaysafe_pg.limits import DEFAULT_LIMITS, Limits
from replaysafe_pg.models import (
    Action,
    ActionState,
    Attempt,
    AttemptToken,
    Claim,
    ClaimOutcome,
    ReportOutcome,
)
from replaysafe_pg.threads import AsyncThreads, Threads, ThreadState, ThreadVersion

__all__ = [
    "DEFAULT_LIMITS",
    "AccessDenied",
    "Action",
    "ActionNotSucceeded",
    "ActionState",
    "AsyncLedger",
    "AsyncThreads",
    "Attempt",
    "AttemptToken",
    "Call",
    "CitusUnavailable",
    "Claim",
    "ClaimOutcome",
    "DatabaseUnavailable",
    "Execution",
    "ExecutionStatus",
    "FingerprintConflict",
    "GrantClaims",
    "InvalidArgument",
    "InvalidTransition",
    "LeaseLost",
    "Ledger",
    "Limits",
    "LoginRefused",
    "OutcomeNotRecorded",
    "ReplaysafeError",
    "ReportOutcome",
    "SchemaNotInstalled",
    "StaleStateError",
    "ThreadState",
    "ThreadVersion",
    "Threads",
    "UnstorableResult",
    "current_revision",
    "downgrade",
    "issue_grant",
    "migrate",
    "migrate_in_env",
    "read_claims",
]

__version__ = "0.1.0"


# The migration functions load alembic and SQLAlchemy (most of a worker's start-up time):
# import them on first use only.
if TYPE_CHECKING:
    from replaysafe_pg.schema import current_revision, downgrade, migrate, migrate_in_env

_LAZY = {"current_revision", "downgrade", "migrate", "migrate_in_env"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from replaysafe_pg import schema

        return getattr(schema, name)
    raise AttributeError(f"module 'replaysafe_pg' has no attribute {name!r}")
