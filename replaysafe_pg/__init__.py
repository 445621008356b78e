"""replaysafe_pg: replay-safe side effects for AI agents, enforced in Postgres."""

from replaysafe_pg.errors import (
    AccessDenied,
    FingerprintConflict,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    ReplaysafeError,
    SchemaNotInstalled,
    StaleStateError,
)
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
from replaysafe_pg.threads import AsyncThreads, Threads, ThreadState, ThreadVersion

__all__ = [
    "AccessDenied",
    "Action",
    "ActionState",
    "AsyncLedger",
    "AsyncThreads",
    "Attempt",
    "Claim",
    "ClaimOutcome",
    "FingerprintConflict",
    "InvalidArgument",
    "InvalidTransition",
    "LeaseLost",
    "Ledger",
    "ReplaysafeError",
    "ReportOutcome",
    "SchemaNotInstalled",
    "StaleStateError",
    "ThreadState",
    "ThreadVersion",
    "Threads",
    "current_revision",
    "downgrade",
    "migrate",
]

__version__ = "0.1.0"
