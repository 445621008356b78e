"""One builder and one decoder per SQL function the driver calls: parameters in, values out.

Pure: nothing here sends anything. A builder checks its arguments (a bad one is refused
before anything is sent) and returns a :class:`Statement` (the query's name, its
parameters and how to read its rows); whoever holds a connection sends it. Every caller
(the ``Ledger`` and ``Threads`` methods, the runner, its retries, the heartbeats) uses these
builders, so a new SQL parameter is added in one place.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, LiteralString, TypeAlias, TypeVar

from replaysafe_pg import _args, _json, queries
from replaysafe_pg._grant import Grant, GrantArg, grant_of, tenant_of
from replaysafe_pg.errors import AccessDenied, InvalidArgument
from replaysafe_pg.limits import DEFAULT_LIMITS, Limits, Payload, limits_of
from replaysafe_pg.models import (
    Action,
    ActionState,
    Attempt,
    AttemptToken,
    Claim,
    ReportOutcome,
    ThreadState,
    ThreadVersion,
)

T = TypeVar("T")
Rows: TypeAlias = list[tuple[Any, ...]]
Lease: TypeAlias = timedelta | float | int


@dataclass(frozen=True, slots=True)
class Statement(Generic[T]):
    """One round trip: the named query from ``sql/queries.sql``, its parameters, and the
    decoder of its rows.

    ``grant``: the tenant grant of the driver object that built it (None: none). Each read
    of :attr:`params` asks it for the current grant, so a statement sent again (a retried
    claim, a heartbeat) carries the grant of that moment. A query that takes ``p_grant``
    gets it as an argument; a view's query (which takes none) is preceded by ``use_grant``
    in its transaction (replaysafe_pg._conn). Without a grant, query and parameters are
    exactly those of a bound login."""

    name: str
    args: dict[str, Any]
    decode: Callable[[Rows], T]
    grant: Grant | None = None

    @property
    def params(self) -> dict[str, Any]:
        """The parameters to send (with ``grant``: the current grant too)."""
        if self.grant is None:
            return self.args
        return self.args | {"grant": self.grant.current()}

    @property
    def query(self) -> LiteralString:
        if self.grant is None:
            return queries.get(self.name, self.args)
        # The form that sends p_grant (get() looks only at whether now and grant are given).
        return queries.get(self.name, {"now": self.args.get("now"), "grant": True})


@dataclass(frozen=True, slots=True)
class Encoded:
    """JSON text the caller has already serialised and checked (the runner's results and
    errors): a builder sends it as is instead of serialising it again."""

    text: str


def _json_arg(value: Any, what: str, payload: Payload, limits: Limits) -> str:
    return value.text if isinstance(value, Encoded) else _json.dumps(value, what, payload, limits)


def _json_object(value: Any, what: str, payload: Payload, limits: Limits) -> str:
    return (value.text if isinstance(value, Encoded)
            else _json.dumps_object(value, what, payload, limits))


def result_too_large(over: dict[str, int]) -> dict[str, Any]:
    """The error an action keeps of a completion over its limits (what ``complete_action``
    itself records for one): ``{"reason": "result_too_large", "bytes": n}`` or
    ``"digits": n`` for the result, ``"provider_reference_bytes": n`` for the provider
    reference."""
    return {"reason": "result_too_large", **over}


# --- decoders ----------------------------------------------------------------------------

def _value(rows: Rows) -> Any:
    return rows[0][0]


class _ClaimOf:
    """The decoder of a claim of ``action_key`` (the answer does not repeat the key)."""

    __slots__ = ("action_key",)

    def __init__(self, action_key: str) -> None:
        self.action_key = action_key

    def __call__(self, rows: Rows) -> Claim:
        return Claim.from_row(rows[0], self.action_key)


class _ClaimsOf:
    __slots__ = ("action_keys",)

    def __init__(self, action_keys: list[str]) -> None:
        self.action_keys = action_keys

    def __call__(self, rows: Rows) -> list[Claim]:
        return [Claim.from_row(r, k) for r, k in zip(rows, self.action_keys, strict=True)]


def _report(rows: Rows) -> ReportOutcome:
    return ReportOutcome(rows[0][0])


def _state(rows: Rows) -> ActionState:
    return ActionState(rows[0][0])


def _action(rows: Rows) -> Action | None:
    return Action.from_row(rows[0]) if rows else None


def _actions(rows: Rows) -> list[Action]:
    return [Action.from_row(r) for r in rows]


def _attempts(rows: Rows) -> list[Attempt]:
    return [Attempt.from_row(r) for r in rows]


def _thread_state(rows: Rows) -> ThreadState:
    return ThreadState(*rows[0])


def _thread_versions(rows: Rows) -> list[ThreadVersion]:
    return [ThreadVersion(*r) for r in rows]


# --- the ledger's functions --------------------------------------------------------------

def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"




def acting_for(grant: Grant | None) -> Statement[None]:
    """``acting_for``: what the caller acts for (under ``grant`` when given). Its answer is
    :class:`~replaysafe_pg.errors.AccessDenied` for a role that acts for no tenant — bound to
    none, not to every tenant, not the schema owner — which sees and changes nothing, so a
    tool must not report "nothing to do" for it; otherwise None."""
    return Statement("acting_for", {"grant": None}, _require_a_tenant, grant)


def _require_a_tenant(rows: Rows) -> None:
    role, tenant, every = rows[0] if rows else (None, None, False)
    if tenant is None and not every:
        raise AccessDenied(
            f"{role} acts for no tenant: it is bound to none, so it sees and changes nothing. "
            "Bind it (SELECT replaysafe.bind_role_to_tenant(p_role => ..., p_tenant_id => ...)), "
            "or, for a role that reads or reconciles every tenant, SELECT "
            "replaysafe.bind_role_to_all_tenants(p_role => ...) (docs/isolation.md"
            "#all-tenant-roles)")


class Statements:
    """The ledger's SQL functions for one tenant and worker (``worker_id`` None: this host
    and process). ``grant``: a tenant grant (or a callable returning the current one) that
    every statement carries; ``tenant_id`` None is then the grant's tenant (else
    ``"default"``), and a ``tenant_id`` the grant is not for is refused. ``limits``: the
    size limits checked before anything is sent (:mod:`replaysafe_pg.limits`)."""

    __slots__ = ("grant", "limits", "tenant_id", "worker_id")

    def __init__(self, tenant_id: str | None, worker_id: str | None,
                 grant: GrantArg | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits_of(limits)
        self.grant = grant_of(grant, tenant_id)
        self.tenant_id = _args.text_id(tenant_of(tenant_id, self.grant), "tenant_id")
        self.worker_id = _args.text_id(
            default_worker_id() if worker_id is None else worker_id, "worker_id")

    def _statement(self, name: str, params: dict[str, Any], decode: Callable[[Rows], T]
                   ) -> Statement[T]:
        return Statement(name, params, decode, self.grant)

    def _key(self, action_key: str) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "action_key": _args.text_id(action_key, "action_key")}

    def _attempt(self, holder: Claim | AttemptToken, now: datetime | None) -> dict[str, Any]:
        """The attempt a heartbeat or report is for, with its token (the attempt's capability)."""
        if not isinstance(holder, Claim | AttemptToken):
            raise InvalidArgument(
                "heartbeats and reports take the Claim that claim() answered (or an "
                f"AttemptToken(action_key, attempt, attempt_token)), not {type(holder).__name__}: "
                "the attempt's token is required")
        if holder.attempt_token is None and isinstance(holder, Claim):
            raise InvalidArgument(
                f"this claim of action {holder.action_key!r} answered {holder.outcome.value!r}: "
                "only a 'claimed' answer holds an attempt (and its token)")
        return self._key(holder.action_key) | {
            "attempt": _args.integer(holder.attempt, "attempt"),
            "attempt_token": _args.secret(holder.attempt_token, "attempt_token"),
            "now": _args.moment(now)}

    def _claim_options(self, lease: Lease, thread_id: str | None, on_expired: str,
                       now: datetime | None) -> dict[str, Any]:
        """What ``claim_action`` and ``claim_actions`` both take after the calls."""
        return {"worker_id": self.worker_id, "lease": _args.lease(lease),
                "thread_id": _args.optional_id(thread_id, "thread_id"),
                "on_expired": _args.text(on_expired, "on_expired"), "now": _args.moment(now)}

    def claim(self, action_key: str, operation: str, request: dict[str, Any] | Encoded,
              lease: Lease, thread_id: str | None, on_expired: str,
              now: datetime | None, claim_token: str | None = None) -> Statement[Claim]:
        key = self._key(action_key)
        return self._statement("claim_action", key | {
            "operation": _args.text_id(operation, "operation"),
            "request": _json_object(request, "request", "request", self.limits),
            "claim_token": None if claim_token is None else _args.secret(claim_token, "claim_token"),
        } | self._claim_options(lease, thread_id, on_expired, now), _ClaimOf(key["action_key"]))

    def claim_many(self, actions: Sequence[tuple[str, str, dict[str, Any] | Encoded]], lease: Lease,
                   thread_id: str | None, on_expired: str,
                   now: datetime | None,
                   claim_tokens: Sequence[str | None] | None = None) -> Statement[list[Claim]]:
        if not all(isinstance(c, tuple | list) and len(c) == 3 for c in actions):
            raise InvalidArgument("claim_many takes (action_key, operation, request) tuples")
        if claim_tokens is not None and (isinstance(claim_tokens, str)
                                         or len(claim_tokens) != len(actions)):
            raise InvalidArgument("claim_tokens must hold one token (or None) per call")
        keys = [_args.text_id(key, "action_key") for key, _, _ in actions]
        return self._statement("claim_actions", {
            "tenant_id": self.tenant_id,
            "action_keys": keys,
            "operations": [_args.text_id(op, "operation") for _, op, _ in actions],
            "requests": [_json_object(req, "request", "request", self.limits)
                         for _, _, req in actions],
            "claim_tokens": None if claim_tokens is None else [
                None if t is None else _args.secret(t, "claim_token") for t in claim_tokens],
        } | self._claim_options(lease, thread_id, on_expired, now), _ClaimsOf(keys))

    def heartbeat(self, holder: Claim | AttemptToken, lease: Lease,
                  now: datetime | None) -> Statement[datetime]:
        return self._statement("heartbeat_action", self._attempt(holder, now) | {
            "lease": _args.lease(lease)}, _value)

    def _reference(self, provider_reference: str | None) -> str | None:
        if provider_reference is None:
            return None
        return self.limits.check_text(_args.text(provider_reference, "provider_reference"),
                                      "provider_reference", "provider_reference")

    def complete(self, holder: Claim | AttemptToken, result: Any, provider_reference: str | None,
                 now: datetime | None) -> Statement[ReportOutcome]:
        """``complete_action``; for a provider reference or result over its limit (which came
        after the side effect), ``mark_action_unknown`` with :func:`result_too_large`
        instead, neither sent: the action becomes ``unknown``, to be reconciled. A reference
        over its limit is checked first and alone, as ``complete_action`` does."""
        reference = (None if provider_reference is None
                     else _args.text(provider_reference, "provider_reference"))
        attempt = self._attempt(holder, now)
        if reference is not None:
            size = self.limits.text_excess(reference, "provider_reference")
            if size is not None:
                error = result_too_large({"provider_reference_bytes": size})
                return self.mark_unknown(holder, Encoded(_json.dumps(error, "error")), now)
        try:
            text = _json_arg(result, "result", "result", self.limits)
        except _json.TooLong as exc:
            return self.mark_unknown(holder, self._too_large(exc.over, reference), now)
        return self._statement("complete_action", attempt | {
            "result": text, "provider_reference": reference}, _report)

    def _too_large(self, over: dict[str, int], reference: str | None) -> Encoded:
        error = result_too_large(over)
        text = _json.dumps(error, "error")
        if reference is not None:
            # The reference says where the effect is; kept unless the error would be too large.
            with_reference = _json.dumps(error | {"provider_reference": reference}, "error")
            if self.limits.excess(with_reference, "error") is None:
                text = with_reference
        return Encoded(text)

    def fail(self, holder: Claim | AttemptToken, error: Any, retryable: bool,
             now: datetime | None) -> Statement[ReportOutcome]:
        return self._statement("fail_action", self._attempt(holder, now) | {
            "error": _json_arg(error, "error", "error", self.limits),
            "retryable": _args.flag(retryable, "retryable"),
        }, _report)

    def mark_unknown(self, holder: Claim | AttemptToken, error: Any,
                     now: datetime | None) -> Statement[ReportOutcome]:
        return self._statement("mark_action_unknown", self._attempt(holder, now) | {
            "error": _json_arg(error, "error", "error", self.limits)}, _report)

    def resolve(self, action_key: str, state: ActionState | str, result: Any, error: Any,
                provider_reference: str | None, note: str | None,
                now: datetime | None, expected_attempt: int | None = None
                ) -> Statement[ActionState]:
        return self._statement("resolve_action", self._key(action_key) | {
            "state": _args.text(str(state) if isinstance(state, ActionState) else state, "state"),
            "result": None if result is None else _json_arg(result, "result", "result",
                                                            self.limits),
            "error": None if error is None else _json_arg(error, "error", "error", self.limits),
            "provider_reference": self._reference(provider_reference),
            "note": _args.optional_text(note, "note"), "now": _args.moment(now),
            "expected_attempt": (None if expected_attempt is None
                                 else _args.integer(expected_attempt, "expected_attempt")),
        }, _state)

    def reopen(self, action_key: str, note: str, now: datetime | None) -> Statement[ActionState]:
        return self._statement("reopen_action", self._key(action_key) | {
            "note": _args.text(note, "note"), "now": _args.moment(now)}, _state)

    def unknown_actions(self, limit: int, older_than: Lease) -> Statement[list[Action]]:
        """The tenant's ``unknown`` actions, oldest first, unknown for longer than
        ``older_than`` (what reconciliation works through)."""
        return self._statement("unknown_actions", {
            "tenant_id": self.tenant_id, "limit": _args.integer(limit, "limit"),
            "older_than": _args.age(older_than, "older_than")}, _actions)

    def sweep(self, limit: int, now: datetime | None) -> Statement[int]:
        """Every tenant the caller may act for; under a grant, the grant's tenant."""
        return self._statement("sweep_expired_actions", {
            "limit": _args.integer(limit, "limit"), "now": _args.moment(now)}, _value)

    def purge(self, older_than: Lease, limit: int, now: datetime | None) -> Statement[int]:
        """As :meth:`sweep`."""
        return self._statement("purge_actions", {
            "older_than": _args.age(older_than, "older_than"),
            "limit": _args.integer(limit, "limit"), "now": _args.moment(now)}, _value)

    def get(self, action_key: str) -> Statement[Action | None]:
        return self._statement("get_action", self._key(action_key), _action)

    def attempts(self, action_key: str) -> Statement[list[Attempt]]:
        return self._statement("list_attempts", self._key(action_key), _attempts)

    def revoke_grants(self) -> Statement[int]:
        """``revoke_tenant_grants`` for this tenant: every grant issued for it so far is
        refused from the next call on; answers the tenant's new generation."""
        return self._statement("revoke_tenant_grants", {"tenant_id": self.tenant_id}, _value)


# --- the thread functions ----------------------------------------------------------------

class ThreadStatements:
    """The thread-state SQL functions for one tenant (and optionally one user). ``grant``
    and ``limits``: as for :class:`Statements`; a grant that names a user restricts the calls to that user's
    threads (``user_id`` None: the grant's user), and a ``user_id`` it is not for is refused."""

    __slots__ = ("grant", "limits", "tenant_id", "user_id")

    def __init__(self, tenant_id: str | None, user_id: str | None,
                 grant: GrantArg | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits_of(limits)
        self.grant = grant_of(grant, tenant_id)
        self.tenant_id = _args.text_id(tenant_of(tenant_id, self.grant), "tenant_id")
        self.user_id = _args.optional_id(user_id, "user_id")
        if (self.grant is not None and self.grant.user_id is not None
                and self.user_id is not None and self.user_id != self.grant.user_id):
            raise InvalidArgument(
                f"user_id is {self.user_id!r}, but the grant is for user "
                f"{self.grant.user_id!r} (omit user_id to act as the grant's user)")

    def _statement(self, name: str, params: dict[str, Any], decode: Callable[[Rows], T]
                   ) -> Statement[T]:
        return Statement(name, params, decode, self.grant)

    def _key(self, thread_id: str) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "thread_id": _args.text_id(thread_id, "thread_id"),
                "user_id": self.user_id}

    def purge(self, older_than: Lease, limit: int, now: datetime | None) -> Statement[int]:
        """``purge_threads``: every tenant the caller may act for; under a grant, the grant's
        tenant (a grant that names a user is refused)."""
        return self._statement("purge_threads", {
            "older_than": _args.age(older_than, "older_than"),
            "limit": _args.integer(limit, "limit"), "now": _args.moment(now)}, _value)

    def read(self, thread_id: str) -> Statement[ThreadState]:
        return self._statement("read_thread", self._key(thread_id), _thread_state)

    def write(self, thread_id: str, state: dict[str, Any], expected_version: int,
              history_limit: int | None) -> Statement[int]:
        if isinstance(expected_version, bool) or not isinstance(expected_version, int):
            raise InvalidArgument("expected_version must be an int (0 creates the thread)")
        return self._statement("write_thread", self._key(thread_id) | {
            "expected_version": expected_version,
            "state": _json.dumps_object(state, "state", "thread_state", self.limits),
            "history_limit": None if history_limit is None
            else _args.integer(history_limit, "history_limit"),
        }, _value)

    def history(self, thread_id: str, limit: int) -> Statement[list[ThreadVersion]]:
        return self._statement("thread_history", self._key(thread_id) | {
            "limit": _args.integer(limit, "limit")}, _thread_versions)

    def delete(self, thread_id: str) -> Statement[bool]:
        return self._statement("delete_thread", self._key(thread_id), _value)
