"""replaysafe_pg: replay-safe side effects for AI agents, enforced in Postgres."""

from replaysafe_pg.errors import (
    AccessDenied,
    ActionNotSucceeded,
    FingerprintConflict,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    OutcomeNotRecorded,
    ReplaysafeError,
    SchemaNotInstalled,
    StaleStateError,
    UnstorableResult,
)
from replaysafe_pg.execution import Call, Execution, ExecutionStatus
from replaysafe_pg.ledger import AsyncLedger, Ledger
from replaysafe_pg.models import (
    Action,
    ActionState,
    Attempt,
    Claim,
    ClaimOutcome,
    ReportOutcome,
)
from replaysafe_pg.schema import current_revision, downgrade, migrate

__all__ = [
    "AccessDenied",
    "Action",
    "ActionNotSucceeded",
    "ActionState",
    "AsyncLedger",
    "Attempt",
    "Call",
    "Claim",
    "ClaimOutcome",
    "Execution",
    "ExecutionStatus",
    "FingerprintConflict",
    "InvalidArgument",
    "InvalidTransition",
    "LeaseLost",
    "Ledger",
    "OutcomeNotRecorded",
    "ReplaysafeError",
    "ReportOutcome",
    "SchemaNotInstalled",
    "StaleStateError",
    "UnstorableResult",
    "current_revision",
    "downgrade",
    "migrate",
]

__version__ = "0.1.0"
