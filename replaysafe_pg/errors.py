"""Domain exceptions and the one place that turns database errors into them.

Every deliberate error raised by the ``replaysafe`` SQL functions carries its own SQLSTATE
of class RS; :func:`wrap_errors` maps it to exactly one exception class.
"""

from __future__ import annotations

import contextlib
import json
import re
from types import TracebackType
from typing import Any

import psycopg
from psycopg import errors as pg_errors


class ReplaysafeError(Exception):
    """Base class of every replaysafe_pg error."""

    sqlstate: str | None = None

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class FingerprintConflict(ReplaysafeError):
    """RS001: the action key exists with a different operation or request."""

    sqlstate = "RS001"


class LeaseLost(ReplaysafeError):
    """RS002: the attempt no longer holds the action's lease."""

    sqlstate = "RS002"


class StaleStateError(ReplaysafeError):
    """RS003: a compare-and-swap write expected another version."""

    sqlstate = "RS003"

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message, detail=detail)
        info: dict[str, Any] = {}
        if detail:
            with contextlib.suppress(ValueError):
                info = json.loads(detail)
        # The DETAIL's JSON, read once (subclasses take their fields from it too).
        self._detail_fields = info
        self.thread_id: str | None = info.get("thread_id")
        self.expected_version: int | None = info.get("expected_version")
        self.current_version: int | None = info.get("current_version")


class StaleCheckpointError(StaleStateError):
    """RS003 for a LangGraph checkpoint (``replaysafe_pg.langgraph``): a checkpoint of the run
    loop whose parent is no longer the newest checkpoint of its thread and namespace (another
    run got there first). Nothing of it was stored. ``.thread_id``, ``.checkpoint_ns``,
    ``.checkpoint_id`` (the refused one), ``.expected_checkpoint_id`` (its parent: what the
    run last read) and ``.current_checkpoint_id`` (the newest one now; None when none)."""

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message, detail=detail)
        info = self._detail_fields
        self.checkpoint_ns: str | None = info.get("checkpoint_ns")
        self.checkpoint_id: str | None = info.get("checkpoint_id")
        self.expected_checkpoint_id: str | None = info.get("expected_checkpoint_id")
        self.current_checkpoint_id: str | None = info.get("current_checkpoint_id")


class AccessDenied(ReplaysafeError):
    """RS004: another user's thread, or another tenant's rows."""

    sqlstate = "RS004"


class InvalidArgument(ReplaysafeError, ValueError):
    """RS005 (or a client-side check): an argument is out of its domain."""

    sqlstate = "RS005"


class InvalidTransition(ReplaysafeError):
    """RS006: the action is not in a state that allows this (or does not exist)."""

    sqlstate = "RS006"


class DatabaseUnavailable(ReplaysafeError):
    """The database did not answer: the connection failed or broke (server restart, a
    terminated backend, a network cut), a statement was cancelled (``statement_timeout``), or
    a pool had no connection to lend. The driver's error is chained (``__cause__``).

    ``Ledger.run`` rides such errors out for as long as the lease it asked for; this is what
    reaches its caller when it could not. A statement that raised it may or may not have
    committed (the answer can be lost after the commit): see docs/errors.md.
    """


class LoginRefused(DatabaseUnavailable):
    """The database, or a pooler in front of it, refused the connection for a reason no
    retry can fix: a login, password or database it does not know, a startup parameter it
    does not take (PgBouncer and ``options``). Never retried by ``run``'s claim."""


class SchemaNotInstalled(ReplaysafeError):
    """The database has no (or an outdated) replaysafe schema: run ``replaysafe-pg migrate``."""


class CitusUnavailable(ReplaysafeError):
    """``migrate(..., citus=True)`` refused: the database cannot take replaysafe's Citus
    distribution (no ``citus`` extension, a Citus older than 11.0, a worker node, a schema
    revision the Citus script was not written for); or ``migrate``/``downgrade`` of an
    installation distributed with Citus, which takes no revision script. Nothing was changed
    (docs/scale-out.md)."""


BY_SQLSTATE: dict[str, type[ReplaysafeError]] = {
    cls.sqlstate: cls
    for cls in (FingerprintConflict, LeaseLost, StaleStateError, AccessDenied,
                InvalidArgument, InvalidTransition)
    if cls.sqlstate
}

# Server-side rejections of a statement for its content or its size, which did not reach our
# own checks: data exceptions (class 22: a JSON text the server cannot store, a NUL
# character, an out-of-range number...) and program limits (class 54: a value nested too
# deep, an array or an index row too large). Sending the statement again cannot help: never
# retried, never DatabaseUnavailable.
_REFUSED_CLASSES = ("22", "54")


# duplicate_prepared_statement, invalid_sql_statement_name: one client's statement names met
# another's on a server connection a pooler shares.
_LOST_PREPARED = ("42P05", "26000")
# What a server or pooler says when it refuses a connection for good (libpq gives these no
# SQLSTATE): retrying cannot help.
_REFUSED_FOR_GOOD = re.compile(
    r"(password|\"trust\"|peer|ident|certificate) authentication failed|no pg_hba\.conf entry"
    r"|role \".*\" does not exist|database \".*\" does not exist|no such user|no such database"
    r"|unsupported startup parameter|unsupported pkt type", re.IGNORECASE)


def translate(exc: psycopg.Error) -> ReplaysafeError | None:
    """The domain exception for a database error, or None if it is not one of ours."""
    state = exc.sqlstate
    if state is None:
        # Raised by psycopg before sending: a parameter it cannot send (a NUL in a text).
        if isinstance(exc, psycopg.DataError):
            return InvalidArgument(f"invalid argument: {exc}")
        return None
    diag = exc.diag
    message = diag.message_primary or str(exc)
    cls = BY_SQLSTATE.get(state)
    if cls is not None:
        return cls(message, detail=diag.message_detail)
    if state[:2] in _REFUSED_CLASSES:
        return InvalidArgument(f"invalid argument: {message}", detail=diag.message_detail)
    if state == "42501":  # insufficient_privilege: row-level security or missing grants
        return AccessDenied(f"access denied: {message}")
    if state == "25006":  # read_only_sql_transaction: a standby, or a read-only default
        return DatabaseUnavailable(
            f"{message}: this session cannot write (a standby, or default_transaction_read_only "
            "set for the login or planted on a pooler's shared server session)")
    if state in _LOST_PREPARED:
        return DatabaseUnavailable(
            f"{message}: named prepared statements do not survive a transaction pooler "
            "(PgBouncer's pool_mode = transaction, a managed pooler): leave the driver "
            "object's prepare=None (the default) or make it prepare=False, docs/deploying.md")
    if state in ("3F000", "42883", "42P01", "42704") and "replaysafe" in str(exc):
        return SchemaNotInstalled(
            "the replaysafe schema is missing or outdated in this database: "
            "run `replaysafe-pg migrate` (or replaysafe_pg.migrate(dsn))")
    return None


class wrap_errors:  # used as ``with wrap_errors():``, like the function it was
    """Re-raise database errors of ours as :class:`ReplaysafeError` subclasses.

    A class, not a generator-based context manager: it wraps every statement, and this form
    costs a third as much per use."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not isinstance(exc, pg_errors.Error):
            return
        domain = translate(exc)
        if domain is not None:
            raise domain from exc
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            if exc.sqlstate is None and _REFUSED_FOR_GOOD.search(str(exc)):
                raise LoginRefused(f"login refused: {_first_line(exc)}") from exc
            raise unavailable(exc) from exc


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def unavailable(exc: BaseException) -> DatabaseUnavailable:
    """The :class:`DatabaseUnavailable` for a driver's connection error (chain it)."""
    return DatabaseUnavailable(f"database unavailable: {_first_line(exc)}")


# --- Errors of Ledger.run (client side: no SQLSTATE of their own) ----------------------

class UnstorableResult(ReplaysafeError):
    """The tool ran but its result cannot be stored as jsonb: the encoder cannot convert it
    (an arbitrary object), or it is NaN/Infinity, holds a NUL character or is too large.

    The action has been marked ``unknown`` (the effect happened, its result is lost to the
    ledger), so it is never re-run automatically. ``.result`` holds what the tool returned;
    ``.result_repr`` its ``repr`` (truncated), which is also kept in the action's error.
    """

    def __init__(self, message: str, *, action_key: str, result: Any = None,
                 result_repr: str | None = None) -> None:
        super().__init__(message)
        self.action_key = action_key
        self.result = result
        self.result_repr = result_repr


class OutcomeNotRecorded(ReplaysafeError):
    """The tool ran, but its outcome could not be written to the ledger (the database stayed
    unreachable through every retry). The action stays ``running`` until its lease runs out,
    then becomes ``unknown``: it is never re-run blindly. ``.execution`` says what the tool did.
    """

    def __init__(self, message: str, *, execution: Any) -> None:
        super().__init__(message)
        self.execution = execution


class ActionNotSucceeded(ReplaysafeError):
    """Raised by ``Execution.unwrap()`` when the action did not succeed."""

    def __init__(self, message: str, *, execution: Any) -> None:
        super().__init__(message)
        self.execution = execution
