"""What ``Ledger.run`` takes and returns: :class:`Call`, :class:`Execution`, and the types of
its ``encoder`` and ``retryable`` arguments."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from replaysafe_pg.errors import ActionNotSucceeded, InvalidArgument
from replaysafe_pg.models import ReportOutcome

# ``run(..., encoder=)``: turns what a tool returned into JSON data (docs/run.md).
Encoder: TypeAlias = Callable[[Any], Any]

Retryable: TypeAlias = (
    "type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool] | None")


class ExecutionStatus(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RUNNING = "running"


@dataclass(slots=True)
class Execution:
    """The outcome of one ``run`` call.

    ``replay`` is true when the tool did not run in this call and ``status``/``result``/
    ``error`` were read from the ledger (a recorded success or failure, or ``unknown``).
    ``exception`` is what the tool raised in *this* call (never set on replays).
    ``outcome`` is what recording this attempt answered (``recorded``, ``late`` or
    ``superseded``); ``None`` when this call did not run the tool.
    """

    status: ExecutionStatus
    result: Any
    error: Any
    replay: bool
    attempt: int
    idempotency_key: str
    action_key: str
    operation: str
    retryable: bool = False
    lease_lost: bool = False
    outcome: ReportOutcome | None = None
    provider_reference: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def succeeded(self) -> bool:
        return self.status == ExecutionStatus.SUCCEEDED

    @property
    def superseded(self) -> bool:
        """This attempt ran the tool, but another attempt's outcome is the action's."""
        return self.outcome == ReportOutcome.SUPERSEDED

    def unwrap(self) -> Any:
        """The result of a succeeded action, else :class:`ActionNotSucceeded`."""
        if self.status == ExecutionStatus.SUCCEEDED:
            return self.result
        raise ActionNotSucceeded(
            f"action {self.action_key!r} ({self.operation}) is {self.status}: {self.error!r}",
            execution=self) from self.exception


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call of :meth:`Ledger.run_many`."""

    operation: str
    fn: Callable[..., Any]
    args: dict[str, Any]
    key: str


def as_call(value: Call | tuple[str, Callable[..., Any], dict[str, Any], str]) -> Call:
    if isinstance(value, Call):
        return value
    if isinstance(value, tuple) and len(value) == 4:
        return Call(*value)
    raise InvalidArgument("calls must be Call objects or (operation, fn, args, key) tuples")
