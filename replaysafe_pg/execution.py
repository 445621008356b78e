"""What ``Ledger.run`` returns, and the pure helpers the sync and async runners share."""

from __future__ import annotations

import enum
import functools
import inspect
import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from replaysafe_pg import _json
from replaysafe_pg.errors import ActionNotSucceeded, InvalidArgument, UnstorableResult
from replaysafe_pg.models import ReportOutcome

# Results larger than this are not stored (jsonb itself stops at 255 MB; a result this big in
# one row would hurt every replay long before that).
MAX_RESULT_BYTES = 64 * 1024 * 1024
# Error messages are kept short: they are replayed to every later caller.
MAX_ERROR_MESSAGE = 4000

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


# --- the tool --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ToolInfo:
    is_async: bool
    accepts_key: bool  # takes an ``idempotency_key`` keyword


_tool_cache: weakref.WeakKeyDictionary[Any, ToolInfo] = weakref.WeakKeyDictionary()


def _accepts_key(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get("idempotency_key")
    # Only a parameter named so: a **kwargs function may forward every keyword downstream.
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _is_async(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004 - async callable objects


def tool_info(fn: Callable[..., Any]) -> ToolInfo:
    """What ``run`` needs to know about a tool, inspected once per function."""
    target = getattr(fn, "__func__", fn)  # bound methods are new objects on every access
    try:
        return _tool_cache[target]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable (some builtins): inspect every time
        return ToolInfo(_is_async(fn), _accepts_key(fn))
    info = ToolInfo(_is_async(fn), _accepts_key(fn))
    _tool_cache[target] = info
    return info


def tool_kwargs(args: dict[str, Any], fn: Callable[..., Any], idem_key: str) -> dict[str, Any]:
    if "idempotency_key" not in args and tool_info(fn).accepts_key:
        return {**args, "idempotency_key": idem_key}
    return args


def is_retryable(exc: BaseException, policy: Retryable) -> bool:
    if policy is None:
        return False
    if isinstance(policy, type | tuple):
        return isinstance(exc, policy)
    return bool(policy(exc))


# --- what gets stored ------------------------------------------------------------------

def _clean(text: str) -> str:
    # jsonb refuses NUL; lone surrogates cannot be encoded as UTF-8.
    text = text.replace("\x00", "\\0")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_of(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A storable description of an exception: ``{"type", "message", ...}``."""
    cls = type(exc)
    message = _clean(str(exc))
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[:MAX_ERROR_MESSAGE] + "..."
    return {"type": f"{cls.__module__}.{cls.__qualname__}", "message": message, **extra}


def dump_error(error: dict[str, Any]) -> str:
    try:
        return _json.dumps(error, "error")
    except InvalidArgument:
        # `extra` values of ours are plain; anything odd is reduced to text.
        return json.dumps({k: _clean(str(v)) for k, v in error.items()}, ensure_ascii=False)


def dump_result(result: Any, action_key: str, limit: int) -> str:
    """``result`` as JSON text for ``complete_action``, or :class:`UnstorableResult`."""
    try:
        text = _json.dumps(result, "result")
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except InvalidArgument as exc:
        raise UnstorableResult(f"the result of action {action_key!r} cannot be stored: {exc}",
                               action_key=action_key, result=result) from None
    except UnicodeEncodeError as exc:
        raise UnstorableResult(
            f"the result of action {action_key!r} cannot be stored: not valid UTF-8 text ({exc})",
            action_key=action_key, result=result) from None
    if size > limit:
        raise UnstorableResult(
            f"the result of action {action_key!r} cannot be stored: {size} bytes of JSON "
            f"exceed the limit of {limit}", action_key=action_key, result=result)
    return text
