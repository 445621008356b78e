"""The tool a plan runs, and what its outcome becomes: how it is called, whether what it
raised may be tried again, and the JSON its result and error are recorded as. Pure helpers
of the run policy (:mod:`replaysafe_pg.run_policy`), no I/O."""

from __future__ import annotations

import functools
import inspect
import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replaysafe_pg import _json
from replaysafe_pg.errors import InvalidArgument, UnstorableResult
from replaysafe_pg.execution import Encoder, Retryable
from replaysafe_pg.limits import Limits, longest_int

# Error messages are kept short: they are replayed to every later caller.
MAX_ERROR_MESSAGE = 4000
# What an unknown action keeps of a result it could not store: its repr, cut to this length.
MAX_RESULT_REPR = 2000


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


def result_repr(result: Any) -> str:
    """``repr(result)``, storable and at most MAX_RESULT_REPR characters (plus "...")."""
    try:
        text = repr(result)
    except Exception as exc:
        cls = type(result)
        text = f"<{cls.__module__}.{cls.__qualname__}: repr() failed: {type(exc).__name__}: {exc}>"
    if len(text) > MAX_RESULT_REPR:
        return _clean(text[:MAX_RESULT_REPR]) + "..."
    return _clean(text)


def unstorable(action_key: str, result: Any, why: str) -> UnstorableResult:
    """The error for a result the ledger cannot store; its ``repr`` goes with it."""
    return UnstorableResult(f"the result of action {action_key!r} cannot be stored: {why}",
                            action_key=action_key, result=result, result_repr=result_repr(result))


def unstorable_error(exc: UnstorableResult) -> dict[str, Any]:
    """What ``mark_action_unknown`` keeps of an unstorable result: enough to resolve the
    action by hand (docs/reconcile.md)."""
    cls = type(exc.result)
    return error_of(exc, reason="unstorable_result",
                    result_type=f"{cls.__module__}.{cls.__qualname__}",
                    result_repr=exc.result_repr)


def dump_result(result: Any, action_key: str, limits: Limits,
                encoder: Encoder | None) -> tuple[str, Any]:
    """``result`` as JSON text for ``complete_action``, and the value a replay reads back
    from that text; or :class:`UnstorableResult`; or, over the result's ``limits``,
    :class:`~replaysafe_pg._json.TooLong` (its ``.over`` says by how much)."""
    try:
        if encoder is None:
            text = _json.pydantic_json(result).decode("utf-8")
        else:
            data = encoder(result)
    except Exception as exc:
        raise unstorable(action_key, result,
                         f"{'pydantic-core' if encoder is None else 'the encoder'} cannot "
                         f"convert it: {type(exc).__name__}: {exc}") from None
    if encoder is not None:
        try:
            text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        except ValueError as exc:
            if "integer string conversion" not in str(exc):
                raise unstorable(action_key, result,
                                 f"the encoder returned what is not JSON: {exc}") from None
            digits = longest_int(data)
            raise _json.TooLong(limits.digits_message(digits, "result"),
                                {"digits": digits}) from None
        except TypeError as exc:
            raise unstorable(action_key, result,
                             f"the encoder returned what is not JSON: {exc}") from None
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise unstorable(action_key, result, f"not valid UTF-8 text ({exc})") from None
    if _json.has_nul(text):
        raise unstorable(action_key, result,
                         "it contains a NUL character (\\u0000), which jsonb cannot store")
    over = limits.excess(text, "result")
    if over is not None:
        raise _json.TooLong(limits.message(over, "result", "result"), over)
    try:
        return text, _json.loads(text)
    except ValueError as exc:  # NaN, Infinity; an integer too long to read back
        raise unstorable(action_key, result, str(exc)) from None
