"""OpenTelemetry spans and metrics for ``run`` (docs/run.md, "Tracing"), when
``opentelemetry-api`` is installed (extra ``otel``).

One span per call of ``run`` and per call of ``run_many``, following the GenAI semantic
conventions for tool execution: ``execute_tool <operation>``, kind INTERNAL, with
``gen_ai.operation.name``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` (the idempotency key),
``gen_ai.tool.type`` and replaysafe's ``replaysafe.replay``, ``replaysafe.outcome``,
``replaysafe.attempt``, ``replaysafe.idempotency_key``; ``error.type`` and an ERROR status
when the tool failed, the outcome is unknown or an exception escaped. Two instruments:
the counter ``replaysafe.tool.executions`` and the histogram ``replaysafe.tool.duration``
(seconds).

The import is tried once; without the package every call gets the same no-op objects. The
global tracer and meter providers are looked up on every call (a dict-free identity check
against the last one seen), so a provider installed after this module was imported is
used, and until an SDK installs one nothing is created at all.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

try:
    from opentelemetry import metrics as _otel_metrics
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - depends on the environment
    _otel_trace = None  # type: ignore[assignment]
    _otel_metrics = None  # type: ignore[assignment]
    _NO_TRACER_PROVIDERS: tuple[type, ...] = ()
    _NO_METER_PROVIDERS: tuple[type, ...] = ()
else:
    # Until an SDK installs a provider, spans and points would be dropped anyway: skip them.
    _NO_TRACER_PROVIDERS = (_otel_trace.ProxyTracerProvider, _otel_trace.NoOpTracerProvider)
    try:
        from opentelemetry.metrics._internal import _ProxyMeterProvider
    except ImportError:  # pragma: no cover - a future API may move it; proxies are cheap too
        _NO_METER_PROVIDERS = (_otel_metrics.NoOpMeterProvider,)
    else:
        _NO_METER_PROVIDERS = (_otel_metrics.NoOpMeterProvider, _ProxyMeterProvider)

SCOPE = "replaysafe_pg"
OPERATION = "execute_tool"
# GenAI semconv: "function" is a tool the client (here: the application) executes itself.
TOOL_TYPE = "function"
EXECUTIONS = "replaysafe.tool.executions"
DURATION = "replaysafe.tool.duration"
# The GenAI conventions' advisory buckets for durations (seconds).
_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
            81.92]
_ERROR_STATUSES = {"failed": "the tool failed", "unknown": "the outcome is unknown"}

# (provider, tracer) and (provider, instruments) last seen: one identity check per call.
_tracer_cache: tuple[Any, Any] | None = None
_meter_cache: tuple[Any, _Instruments] | None = None


def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("replaysafe-pg")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return None


def _tracer() -> Any:
    """The SDK's tracer of the current global provider, or None without one."""
    global _tracer_cache
    provider = _otel_trace.get_tracer_provider()
    if isinstance(provider, _NO_TRACER_PROVIDERS):
        return None
    cached = _tracer_cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = provider.get_tracer(SCOPE, _version())
    _tracer_cache = (provider, tracer)
    return tracer


class _Instruments:
    __slots__ = ("duration", "executions")

    def __init__(self, meter: Any) -> None:
        self.executions = meter.create_counter(
            EXECUTIONS, unit="{execution}",
            description="Calls of Ledger.run and of run_many, by tool, outcome and replay")
        self.duration = meter.create_histogram(
            DURATION, unit="s", description="How long a call of run took, replays included",
            explicit_bucket_boundaries_advisory=_BUCKETS)


def _instruments() -> _Instruments | None:
    global _meter_cache
    provider = _otel_metrics.get_meter_provider()
    if isinstance(provider, _NO_METER_PROVIDERS):
        return None
    cached = _meter_cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    instruments = _Instruments(provider.get_meter(SCOPE, _version()))
    _meter_cache = (provider, instruments)
    return instruments


def error_type(outcome: str, error: Any) -> str:
    """``error.type`` of a failed or unknown outcome: the error's ``reason`` (``timeout``,
    ``cancelled``, ...), else the exception type it names, else the outcome itself."""
    if isinstance(error, dict):
        for field in ("reason", "type"):
            value = error.get(field)
            if isinstance(value, str) and value:
                return value
    return outcome


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


class NoCall:
    """What every call gets without OpenTelemetry (or without a configured provider)."""

    __slots__ = ()

    def set(self, *, idempotency_key: str, outcome: str, replay: bool, attempt: int,
            error: Any) -> None:
        pass

    def current(self) -> contextlib.AbstractContextManager[None]:
        return _NULL

    def end(self) -> None:
        pass


_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()
NO_CALL = NoCall()
_NO_CONTEXT: contextlib.nullcontext[NoCall] = contextlib.nullcontext(NO_CALL)


class Call(NoCall):
    """One tool call's span (None without a tracer provider) and its metric points (none
    without a meter provider), from its start to :meth:`end`."""

    __slots__ = ("_attributes", "_ended", "_error_type", "_instruments", "_span", "_started")

    def __init__(self, tracer: Any, instruments: _Instruments | None, operation: str,
                 action_key: str) -> None:
        self._started = time.perf_counter()
        self._instruments = instruments
        self._ended = False
        self._error_type: str | None = None
        # The metrics' attributes (bounded: no key, no attempt).
        self._attributes: dict[str, Any] = {"gen_ai.operation.name": OPERATION,
                                            "gen_ai.tool.name": operation}
        self._span = None if tracer is None else tracer.start_span(
            f"{OPERATION} {operation}", kind=_otel_trace.SpanKind.INTERNAL,
            attributes={"gen_ai.operation.name": OPERATION, "gen_ai.tool.name": operation,
                        "gen_ai.tool.type": TOOL_TYPE})

    def set(self, *, idempotency_key: str, outcome: str, replay: bool, attempt: int,
            error: Any) -> None:
        """The call's Execution: its outcome, and an error status if it failed or is unknown."""
        self._attributes["replaysafe.outcome"] = outcome
        self._attributes["replaysafe.replay"] = replay
        description = _ERROR_STATUSES.get(outcome)
        if description is not None:
            self._error_type = error_type(outcome, error)
            self._attributes["error.type"] = self._error_type
        span = self._span
        if span is None:
            return
        # The call's id is its idempotency key: stable across retries and replays, and opaque
        # (the action key may carry an order number or a user's data; no span carries it).
        span.set_attributes({"gen_ai.tool.call.id": idempotency_key,
                             "replaysafe.replay": replay, "replaysafe.outcome": outcome,
                             "replaysafe.attempt": attempt,
                             "replaysafe.idempotency_key": idempotency_key})
        if description is not None:
            span.set_attribute("error.type", self._error_type)
            span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, description))

    def raised(self, exc: BaseException) -> None:
        """An exception escaped the call: recorded on its span (if nothing set an outcome)."""
        if self._ended or self._error_type is not None or "replaysafe.outcome" in self._attributes:
            return  # already recorded, or the call has an outcome of its own
        self._error_type = _qualname(exc)
        self._attributes["error.type"] = self._error_type
        span = self._span
        if span is not None:
            span.record_exception(exc)
            span.set_attribute("error.type", self._error_type)
            span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR,
                                               f"{type(exc).__name__}: {exc}"))

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        try:
            if self._span is None:
                yield
            else:
                with _otel_trace.use_span(self._span, end_on_exit=False, record_exception=False,
                                          set_status_on_exception=False):
                    yield
        except GeneratorExit:
            raise
        except BaseException as exc:
            self.raised(exc)
            raise

    def current(self) -> contextlib.AbstractContextManager[None]:
        """The call's span is the current one inside (the tool's own spans are its children);
        an exception escaping is recorded on it."""
        return self._current()

    def end(self) -> None:
        """Ends the span and records the metrics' points (once; later calls do nothing)."""
        if self._ended:
            return
        self._ended = True
        if self._span is not None:
            self._span.end()
        if self._instruments is not None:
            self._instruments.executions.add(1, self._attributes)
            self._instruments.duration.record(time.perf_counter() - self._started,
                                              self._attributes)


def _enabled() -> tuple[Any, _Instruments | None] | None:
    if _otel_trace is None:
        return None
    tracer, instruments = _tracer(), _instruments()
    if tracer is None and instruments is None:
        return None
    return tracer, instruments


@contextlib.contextmanager
def _one(call: Call) -> Iterator[Call]:
    try:
        with call.current():
            yield call
    finally:
        call.end()


def span(operation: str, action_key: str) -> contextlib.AbstractContextManager[NoCall]:
    """``run``: one call, current inside, ended at the exit."""
    enabled = _enabled()
    if enabled is None:
        return _NO_CONTEXT
    return _one(Call(*enabled, operation, action_key))


def calls(operations_and_keys: Sequence[tuple[str, str]]) -> list[NoCall]:
    """``run_many``: a call per (operation, action key), started now (before the claim);
    each is made current with :meth:`Call.current` where it runs and ended by
    :func:`ending` at the latest."""
    enabled = _enabled()
    if enabled is None:
        return [NO_CALL] * len(operations_and_keys)
    return [Call(*enabled, operation, key) for operation, key in operations_and_keys]


@contextlib.contextmanager
def _ending(started: list[NoCall]) -> Iterator[None]:
    try:
        yield
    except GeneratorExit:
        raise
    except BaseException as exc:
        for call in started:
            if isinstance(call, Call):
                call.raised(exc)
        raise
    finally:
        for call in started:
            call.end()


def ending(started: list[NoCall]) -> contextlib.AbstractContextManager[None]:
    """Ends every call of ``started`` at the exit; an exception escaping is recorded on
    those that have no outcome yet."""
    if not started or started[0] is NO_CALL:
        return _NULL
    return _ending(started)
