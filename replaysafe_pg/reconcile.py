"""Reconciliation: settle ``unknown`` actions by asking the provider, never by guessing.

A **lookup** is a callable per operation, ``lookup(action) -> Succeeded | Failed | NotFound``
(the async flavour awaits coroutine lookups), that asks the provider whether the effect of
``action`` happened: by ``action.idempotency_key`` (the key every attempt passed downstream)
or ``action.provider_reference``. Each answer settles the action through ``resolve_action``
with ``p_expected_attempt`` = the attempt the lookup saw, so a stale lookup never settles a
newer attempt, and a second reconciler finds the action settled (``already_resolved``).
Reconciling is an operator's duty (``replaysafe_operator``). See docs/reconcile.md.

This module is the policy (what an answer means, the note it leaves) and the two I/O loops
that the ``Ledger`` and ``AsyncLedger`` facades hand their connection to.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeAlias, TypeVar

from replaysafe_pg import _args
from replaysafe_pg.calls import Calls, Statement
from replaysafe_pg.errors import InvalidArgument, InvalidTransition
from replaysafe_pg.models import Action, ActionState

__all__ = [
    "Action",
    "Failed",
    "Lookup",
    "NotFound",
    "ReconcileOutcome",
    "Reconciliation",
    "Succeeded",
]

T = TypeVar("T")
# How many lookups may be in flight at once by default: providers rate-limit.
DEFAULT_CONCURRENCY = 8
NOT_FOUND_POLICIES = ("retry", "leave")


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The provider holds the effect: the action becomes ``succeeded`` with this result."""

    result: Any = None
    provider_reference: str | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The provider refused the effect: the action becomes ``failed`` with this error."""

    error: Any


@dataclass(frozen=True, slots=True)
class NotFound:
    """The provider has no effect for this idempotency key or reference."""


Verdict: TypeAlias = Succeeded | Failed | NotFound
Lookup: TypeAlias = Callable[[Action], "Verdict | Awaitable[Verdict]"]


class ReconcileOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYABLE = "retryable"
    LEFT_UNKNOWN = "left_unknown"
    SKIPPED = "skipped"
    ERROR = "error"
    ALREADY_RESOLVED = "already_resolved"


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What reconciling one action did (or, with ``dry_run``, would do)."""

    tenant_id: str
    action_key: str
    operation: str
    outcome: ReconcileOutcome
    provider_reference: str | None
    note: str | None
    attempt: int
    error: str | None = None  # what went wrong, for ``error``
    dry_run: bool = False


# --- the policy -------------------------------------------------------------------------

def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decide(calls: Calls, action: Action, verdict: Any, not_found: str,
           dry_run: bool) -> tuple[Statement[ActionState] | None, Reconciliation]:
    """What an answer of the provider means: the statement that settles the action (None:
    nothing to write) and the record of it."""
    base = Reconciliation(tenant_id=action.tenant_id, action_key=action.action_key,
                          operation=action.operation, outcome=ReconcileOutcome.ERROR,
                          provider_reference=action.provider_reference, note=None,
                          attempt=action.attempt, dry_run=dry_run)
    if isinstance(verdict, Succeeded):
        reference = verdict.provider_reference or action.provider_reference
        note = ("reconciled: found at provider"
                + (f", reference {reference}" if reference else ", no reference"))
        done = replace(base, outcome=ReconcileOutcome.SUCCEEDED, provider_reference=reference,
                       note=note)
        return calls.resolve(action.action_key, ActionState.SUCCEEDED, verdict.result, None,
                             reference, note, None, expected_attempt=action.attempt), done
    if isinstance(verdict, Failed):
        note = "reconciled: refused at provider"
        done = replace(base, outcome=ReconcileOutcome.FAILED, note=note)
        return calls.resolve(action.action_key, ActionState.FAILED, None, verdict.error, None,
                             note, None, expected_attempt=action.attempt), done
    if isinstance(verdict, NotFound):
        if not_found == "leave":
            return None, replace(base, outcome=ReconcileOutcome.LEFT_UNKNOWN,
                                 note="not found at provider: left unknown")
        note = "reconciled: not found at provider, will run again with the same idempotency key"
        done = replace(base, outcome=ReconcileOutcome.RETRYABLE, note=note)
        return calls.resolve(action.action_key, ActionState.RETRYABLE, None,
                             {"reason": "not_found_at_provider"}, None, note, None,
                             expected_attempt=action.attempt), done
    return None, replace(base, error=f"the lookup returned {_short(verdict)}, not Succeeded, "
                                     "Failed or NotFound: nothing written")


def _skipped(action: Action, dry_run: bool) -> Reconciliation:
    return Reconciliation(tenant_id=action.tenant_id, action_key=action.action_key,
                          operation=action.operation, outcome=ReconcileOutcome.SKIPPED,
                          provider_reference=action.provider_reference,
                          note=f"no lookup for operation {action.operation}",
                          attempt=action.attempt, dry_run=dry_run)


def _failed_lookup(action: Action, exc: BaseException, dry_run: bool) -> Reconciliation:
    return Reconciliation(tenant_id=action.tenant_id, action_key=action.action_key,
                          operation=action.operation, outcome=ReconcileOutcome.ERROR,
                          provider_reference=action.provider_reference, note=None,
                          attempt=action.attempt,
                          error=f"the lookup raised {type(exc).__name__}: {_short(str(exc))}; "
                                "nothing written", dry_run=dry_run)


@dataclass(frozen=True, slots=True)
class Request:
    """The arguments of one ``reconcile`` call, checked before anything is sent."""

    lookups: Mapping[str, Lookup]
    limit: int
    older_than: timedelta
    not_found: str
    dry_run: bool
    concurrency: int

    @classmethod
    def of(cls, lookups: Any, limit: Any, older_than: Any, not_found: Any, dry_run: Any,
           concurrency: Any) -> Request:
        if not isinstance(lookups, Mapping) or not all(
                isinstance(k, str) and callable(v) for k, v in lookups.items()):
            raise InvalidArgument("lookups must map operation names to callables")
        if not_found not in NOT_FOUND_POLICIES:
            raise InvalidArgument(f"not_found must be 'retry' or 'leave' (got {not_found!r})")
        limit = _args.integer(limit, "limit")
        concurrency = _args.integer(concurrency, "concurrency")
        if limit < 1 or concurrency < 1:
            raise InvalidArgument("limit and concurrency must be positive")
        return cls(lookups, limit, _args.age(older_than, "older_than"), not_found,
                   _args.flag(dry_run, "dry_run"), concurrency)


def _settle(send: Callable[[Statement[ActionState]], ActionState],
            statement: Statement[ActionState] | None, done: Reconciliation) -> Reconciliation:
    if statement is None or done.dry_run:
        return done
    try:
        send(statement)
    except InvalidTransition:
        # Settled (or re-run) since the lookup: another reconciler, an operator, a worker's
        # late report. The action's own state says what it is now.
        return replace(done, outcome=ReconcileOutcome.ALREADY_RESOLVED)
    return done


def _verdict_or_record(lookup: Lookup, action: Action,
                       dry_run: bool) -> tuple[Any, Reconciliation | None]:
    try:
        return lookup(action), None
    except Exception as exc:  # a lookup's failure is reported, never raised: nothing written
        return None, _failed_lookup(action, exc, dry_run)


# --- the I/O loops ----------------------------------------------------------------------

def reconcile(send: Callable[[Statement[Any]], Any], calls: Calls,
              request: Request) -> list[Reconciliation]:
    """Look up every due ``unknown`` action (lookups overlap, up to ``concurrency``), then
    settle them oldest first, one round trip each."""
    actions: list[Action] = send(calls.unknown_actions(request.limit, request.older_than))
    todo = [a for a in actions if a.operation in request.lookups]
    with ThreadPoolExecutor(max_workers=max(1, min(request.concurrency, len(todo)))) as pool:
        answers = dict(zip((a.action_key for a in todo), pool.map(
            lambda a: _verdict_or_record(request.lookups[a.operation], a, request.dry_run), todo),
            strict=True))
    return [_settle(send, *_plan_one(calls, request, action, answers)) for action in actions]


def _plan_one(calls: Calls, request: Request, action: Action,
              answers: Mapping[str, tuple[Any, Reconciliation | None]]
              ) -> tuple[Statement[ActionState] | None, Reconciliation]:
    if action.action_key not in answers:
        return None, _skipped(action, request.dry_run)
    verdict, failed = answers[action.action_key]
    if failed is not None:
        return None, failed
    try:
        return decide(calls, action, verdict, request.not_found, request.dry_run)
    except InvalidArgument as exc:  # e.g. a result that is not JSON: this action only
        return None, replace(_failed_lookup(action, exc, request.dry_run),
                             error=f"the lookup's answer cannot be stored: {exc}; nothing written")


async def areconcile(send: Callable[[Statement[Any]], Awaitable[Any]], calls: Calls,
                     request: Request) -> list[Reconciliation]:
    """The async flavour: coroutine lookups are awaited, up to ``concurrency`` at once."""
    actions: list[Action] = await send(calls.unknown_actions(request.limit, request.older_than))
    gate = asyncio.Semaphore(request.concurrency)

    async def ask(action: Action) -> tuple[Any, Reconciliation | None]:
        async with gate:
            try:
                answer = request.lookups[action.operation](action)
                if inspect.isawaitable(answer):
                    answer = await answer
                return answer, None
            except Exception as exc:
                return None, _failed_lookup(action, exc, request.dry_run)

    todo = [a for a in actions if a.operation in request.lookups]
    answers = dict(zip((a.action_key for a in todo),
                       await asyncio.gather(*(ask(a) for a in todo)), strict=True))
    out: list[Reconciliation] = []
    for action in actions:
        statement, done = _plan_one(calls, request, action, answers)
        if statement is not None and not done.dry_run:
            try:
                await send(statement)
            except InvalidTransition:  # as in _settle
                done = replace(done, outcome=ReconcileOutcome.ALREADY_RESOLVED)
        out.append(done)
    return out


def summary(results: Sequence[Reconciliation]) -> dict[str, int]:
    """How many of each outcome (for logs and the command line)."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
    return counts
