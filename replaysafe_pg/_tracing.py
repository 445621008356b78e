"""An OpenTelemetry span per ``run`` attempt when ``opentelemetry-api`` is installed.

The import is tried once; without the package every call gets the same no-op context.
Spans carry a hash of the idempotency key, never the action key itself (keys may hold
customer or order ids).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - depends on the environment
    _otel_trace = None  # type: ignore[assignment]
    _NO_PROVIDERS: tuple[type, ...] = ()
    _tracer: Any = None
else:
    # Until an SDK installs a provider, spans would be dropped anyway: skip them entirely.
    _NO_PROVIDERS = (_otel_trace.ProxyTracerProvider, _otel_trace.NoOpTracerProvider)
    _tracer = _otel_trace.get_tracer("replaysafe_pg")  # a proxy: follows a later provider


class _NoSpan:
    __slots__ = ()

    def set(self, *, idempotency_key: str, **attributes: Any) -> None:
        pass


class _Span:
    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, *, idempotency_key: str, **attributes: Any) -> None:
        self._span.set_attribute("replaysafe.key_hash", key_hash(idempotency_key))
        for name, value in attributes.items():
            if value is not None:
                self._span.set_attribute(f"replaysafe.{name}", value)


_NO_SPAN = _NoSpan()
_NO_CONTEXT: contextlib.nullcontext[_NoSpan] = contextlib.nullcontext(_NO_SPAN)


def key_hash(idempotency_key: str) -> str:
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _span(operation: str) -> Iterator[_Span]:
    with _tracer.start_as_current_span("replaysafe.run " + operation) as span:
        span.set_attribute("replaysafe.operation", operation)
        yield _Span(span)


def span(operation: str) -> contextlib.AbstractContextManager[_Span | _NoSpan]:
    if _otel_trace is None or isinstance(_otel_trace.get_tracer_provider(), _NO_PROVIDERS):
        return _NO_CONTEXT
    return _span(operation)
