"""docs/run.md, "Tracing": the OpenTelemetry spans (GenAI conventions) and metrics of ``run``,
``run_many`` and ``AsyncLedger.run``, with the SDK's in-memory exporter and reader.

OpenTelemetry lets a process set its global providers once; ``_tracing`` looks them up on
every call (``trace.get_tracer_provider()``, ``metrics.get_meter_provider()``), so each test
here answers those look-ups with providers of its own (``monkeypatch``) and leaves the real
globals alone for the rest of the suite.
"""

from __future__ import annotations

import asyncio
import io
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics import export as metrics_export
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace import export as trace_export
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from replaysafe_pg import AsyncLedger, Call, FingerprintConflict, Ledger, _tracing

DOC = Path(__file__).resolve().parents[2] / "docs" / "run.md"


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    dsn: str

    def key_of(self, span: ReadableSpan) -> str:
        """The action key of a span's call (its gen_ai.tool.call.id is the idempotency key)."""
        with psycopg.connect(self.dsn) as c:
            row = c.execute("SELECT action_key FROM replaysafe.actions WHERE idempotency_key = %s",
                            (attrs(span)["gen_ai.tool.call.id"],)).fetchone()
        assert row is not None
        key: str = row[0]
        return key

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [point for rm in data.resource_metrics for sm in rm.scope_metrics
                for metric in sm.metrics if metric.name == name
                for point in metric.data.data_points]


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch, dsn: str) -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: tracer_provider)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: meter_provider)
    yield Otel(exporter, reader, tracer_provider, dsn)
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def led(dsn: str) -> Iterator[Ledger]:
    with Ledger(dsn, tenant_id="t1", worker_id="w1") as ledger:
        yield ledger


def refund(order_id: str, amount: int, idempotency_key: str) -> dict[str, Any]:
    return {"id": f"re_{order_id}", "amount": amount}


def declined(order_id: str) -> None:
    raise ValueError(f"card declined for {order_id}")


def slow(order_id: str) -> None:
    time.sleep(0.5)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def check_call(span: ReadableSpan, operation: str, key: str, *, replay: bool, outcome: str,
               attempt: int = 1) -> dict[str, Any]:
    found = attrs(span)
    assert span.name == f"execute_tool {operation}"
    assert span.kind is SpanKind.INTERNAL
    assert found["gen_ai.operation.name"] == "execute_tool"
    assert found["gen_ai.tool.name"] == operation
    # The call's id is its idempotency key; the action key is in no attribute.
    assert found["gen_ai.tool.call.id"] == found["replaysafe.idempotency_key"]
    assert not any(key in str(value) for value in found.values())
    assert found["gen_ai.tool.type"] == "function"
    assert found["replaysafe.replay"] is replay
    assert found["replaysafe.outcome"] == outcome
    assert found["replaysafe.attempt"] == attempt
    assert re.fullmatch(r"rs2_\w+", found["replaysafe.idempotency_key"])
    return found


# --- spans ---------------------------------------------------------------------------------

def test_a_first_run_and_its_replay(led: Ledger, otel: Otel) -> None:
    first = led.run("refund", refund, {"order_id": "o1", "amount": 5}, key="order-1")
    again = led.run("refund", refund, {"order_id": "o1", "amount": 5}, key="order-1")
    spans = otel.finished()
    assert len(spans) == 2
    found = check_call(spans[0], "refund", "order-1", replay=False, outcome="succeeded")
    assert found["replaysafe.idempotency_key"] == first.idempotency_key
    assert "error.type" not in found and spans[0].status.status_code is StatusCode.UNSET
    check_call(spans[1], "refund", "order-1", replay=True, outcome="succeeded")
    assert attrs(spans[1])["replaysafe.idempotency_key"] == again.idempotency_key
    assert not spans[0].events and spans[0].parent is None


def test_a_failing_tool_is_an_error(led: Ledger, otel: Otel) -> None:
    ex = led.run("charge", declined, {"order_id": "o2"}, key="order-2")
    assert ex.status == "failed"
    [span] = otel.finished()
    found = check_call(span, "charge", "order-2", replay=False, outcome="failed")
    assert found["error.type"] == "builtins.ValueError"
    assert span.status.status_code is StatusCode.ERROR
    # Its replay is as failed (and as much an error).
    led.run("charge", declined, {"order_id": "o2"}, key="order-2")
    replayed = otel.finished()[1]
    assert attrs(replayed)["error.type"] == "builtins.ValueError"
    assert attrs(replayed)["replaysafe.replay"] is True
    assert replayed.status.status_code is StatusCode.ERROR


def test_an_unknown_outcome_is_an_error(led: Ledger, otel: Otel) -> None:
    ex = led.run("charge", slow, {"order_id": "o3"}, key="order-3", timeout=0.05)
    assert ex.status == "unknown"
    [span] = otel.finished()
    found = check_call(span, "charge", "order-3", replay=False, outcome="unknown")
    assert found["error.type"] == "timeout"
    assert span.status.status_code is StatusCode.ERROR


def test_an_exception_escaping_run_is_recorded(led: Ledger, otel: Otel) -> None:
    led.run("refund", refund, {"order_id": "o4", "amount": 5}, key="order-4")
    with pytest.raises(FingerprintConflict):
        led.run("refund", refund, {"order_id": "o4", "amount": 6}, key="order-4")
    span = otel.finished()[1]
    found = attrs(span)
    assert "gen_ai.tool.call.id" not in found and "replaysafe.outcome" not in found
    assert found["error.type"] == "replaysafe_pg.errors.FingerprintConflict"
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


def test_the_span_is_the_tools_parent_and_the_callers_child(led: Ledger, otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("test")

    def traced_tool(order_id: str) -> str:
        with tracer.start_as_current_span("provider call"):
            return order_id

    with tracer.start_as_current_span("agent turn"):
        led.run("lookup", traced_tool, {"order_id": "o5"}, key="order-5")
    inner, call, outer = otel.finished()
    assert [inner.name, call.name, outer.name] == ["provider call", "execute_tool lookup",
                                                   "agent turn"]
    assert inner.parent is not None and call.context is not None
    assert inner.parent.span_id == call.context.span_id
    assert call.parent is not None and outer.context is not None
    assert call.parent.span_id == outer.context.span_id


def test_run_many_a_span_per_call(led: Ledger, otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("test")
    led.run("refund", refund, {"order_id": "a", "amount": 1}, key="many-a")
    otel.spans.clear()

    def looked_up(order_id: str) -> str:
        with tracer.start_as_current_span("provider call"):
            return order_id

    calls = [Call("refund", refund, {"order_id": "a", "amount": 1}, "many-a"),  # a replay
             Call("lookup", looked_up, {"order_id": "b"}, "many-b"),
             Call("lookup", looked_up, {"order_id": "c"}, "many-c"),
             Call("charge", declined, {"order_id": "d"}, "many-d")]
    with tracer.start_as_current_span("agent turn"):
        out = led.run_many(calls)
    assert [e.status for e in out] == ["succeeded", "succeeded", "succeeded", "failed"]
    executed = [s for s in otel.finished() if s.name.startswith("execute_tool")]
    by_key = {otel.key_of(s): s for s in executed}
    assert len(executed) == 4 and sorted(by_key) == ["many-a", "many-b", "many-c", "many-d"]
    check_call(by_key["many-a"], "refund", "many-a", replay=True, outcome="succeeded")
    check_call(by_key["many-b"], "lookup", "many-b", replay=False, outcome="succeeded")
    check_call(by_key["many-d"], "charge", "many-d", replay=False, outcome="failed")
    assert by_key["many-d"].status.status_code is StatusCode.ERROR
    [outer] = [s for s in otel.finished() if s.name == "agent turn"]
    assert outer.context is not None
    for span in by_key.values():  # children of the caller's span, also from worker threads
        assert span.parent is not None and span.parent.span_id == outer.context.span_id
    providers = [s for s in otel.finished() if s.name == "provider call"]
    assert len(providers) == 2
    call_ids = {c.span_id for k in ("many-b", "many-c") if (c := by_key[k].context) is not None}
    assert {p.parent.span_id for p in providers if p.parent is not None} == call_ids


def test_run_many_an_escaping_exception_ends_every_span(led: Ledger, otel: Otel) -> None:
    led.run("refund", refund, {"order_id": "x", "amount": 1}, key="many-x")
    otel.spans.clear()
    with pytest.raises(FingerprintConflict):
        led.run_many([Call("refund", refund, {"order_id": "x", "amount": 2}, "many-x"),
                      Call("refund", refund, {"order_id": "y", "amount": 2}, "many-y")])
    spans = otel.finished()
    assert [s.name for s in spans] == ["execute_tool refund"] * 2
    for span in spans:
        assert span.status.status_code is StatusCode.ERROR
        assert attrs(span)["error.type"] == "replaysafe_pg.errors.FingerprintConflict"


def test_the_async_flavour(dsn: str, otel: Otel) -> None:
    async def arefund(order_id: str, idempotency_key: str) -> dict[str, str]:
        await asyncio.sleep(0)
        return {"id": order_id}

    async def asleep(order_id: str) -> None:
        await asyncio.sleep(1)

    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1", worker_id="w") as led:
            await led.run("refund", arefund, {"order_id": "o6"}, key="async-1")
            await led.run("refund", arefund, {"order_id": "o6"}, key="async-1")
            ex = await led.run("charge", asleep, {"order_id": "o7"}, key="async-2",
                               timeout=0.05)
            assert ex.status == "unknown"
            await led.run_many([Call("refund", arefund, {"order_id": "o6"}, "async-1"),
                                Call("charge", declined, {"order_id": "o8"}, "async-3")])

    asyncio.run(main())
    spans = otel.finished()
    assert [otel.key_of(s) for s in spans[:3]] == ["async-1", "async-1", "async-2"]
    check_call(spans[0], "refund", "async-1", replay=False, outcome="succeeded")
    check_call(spans[1], "refund", "async-1", replay=True, outcome="succeeded")
    found = check_call(spans[2], "charge", "async-2", replay=False, outcome="unknown")
    assert found["error.type"] == "timeout" and spans[2].status.status_code is StatusCode.ERROR
    many = {otel.key_of(s): s for s in spans[3:]}
    check_call(many["async-1"], "refund", "async-1", replay=True, outcome="succeeded")
    check_call(many["async-3"], "charge", "async-3", replay=False, outcome="failed")
    assert many["async-3"].status.status_code is StatusCode.ERROR


# --- metrics -------------------------------------------------------------------------------

def test_the_metrics_points(led: Ledger, otel: Otel) -> None:
    led.run("refund", refund, {"order_id": "m1", "amount": 5}, key="metric-1")
    led.run("refund", refund, {"order_id": "m1", "amount": 5}, key="metric-1")
    led.run("charge", declined, {"order_id": "m2"}, key="metric-2")
    led.run("charge", slow, {"order_id": "m3"}, key="metric-3", timeout=0.05)
    counts = {tuple(sorted(p.attributes.items())): p.value
              for p in otel.points("replaysafe.tool.executions")}
    base = (("gen_ai.operation.name", "execute_tool"),)
    assert counts == {
        (*base, ("gen_ai.tool.name", "refund"), ("replaysafe.outcome", "succeeded"),
         ("replaysafe.replay", False)): 1,
        (*base, ("gen_ai.tool.name", "refund"), ("replaysafe.outcome", "succeeded"),
         ("replaysafe.replay", True)): 1,
        (("error.type", "builtins.ValueError"), *base, ("gen_ai.tool.name", "charge"),
         ("replaysafe.outcome", "failed"), ("replaysafe.replay", False)): 1,
        (("error.type", "timeout"), *base, ("gen_ai.tool.name", "charge"),
         ("replaysafe.outcome", "unknown"), ("replaysafe.replay", False)): 1,
    }
    durations = otel.points("replaysafe.tool.duration")
    assert sum(p.count for p in durations) == 4
    [timed_out] = [p for p in durations if p.attributes.get("error.type") == "timeout"]
    assert 0.05 <= timed_out.sum < 5
    assert all(p.attributes.get("gen_ai.tool.call.id") is None for p in durations)


def test_metrics_without_a_tracer_provider(led: Ledger, otel: Otel,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    led.run("refund", refund, {"order_id": "m4", "amount": 5}, key="metric-4")
    assert otel.finished() == []
    [point] = otel.points("replaysafe.tool.executions")
    assert point.value == 1 and point.attributes["replaysafe.outcome"] == "succeeded"


# --- without providers ---------------------------------------------------------------------

def test_nothing_is_created_without_providers(led: Ledger,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    monkeypatch.setattr(metrics, "get_meter_provider", metrics.NoOpMeterProvider)
    assert _tracing.span("refund", "k") is _tracing.span("other", "k2")  # one shared no-op
    assert _tracing.calls([("a", "k"), ("b", "k2")]) == [_tracing.NO_CALL] * 2
    ex = led.run("refund", refund, {"order_id": "n1", "amount": 5}, key="none-1")
    assert ex.status == "succeeded"
    assert [e.status for e in led.run_many([Call("refund", declined, {"order_id": "n2"},
                                                 "none-2")])] == ["failed"]


# --- docs/run.md's example -----------------------------------------------------------------

def test_the_docs_example_runs(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    section = DOC.read_text().split("## Tracing\n", 1)[1].split("\n## ", 1)[0]
    [example] = re.findall(r"```python\n(.*?)```", section, re.S)
    installed: dict[str, Any] = {}
    # The console exporters bind sys.stdout when imported: theirs write to a buffer here.
    console = io.StringIO()

    class SpansToBuffer(trace_export.ConsoleSpanExporter):
        def __init__(self) -> None:
            super().__init__(out=console)

    class MetricsToBuffer(metrics_export.ConsoleMetricExporter):
        def __init__(self) -> None:
            super().__init__(out=console)

    monkeypatch.setattr(trace_export, "ConsoleSpanExporter", SpansToBuffer)
    monkeypatch.setattr(metrics_export, "ConsoleMetricExporter", MetricsToBuffer)
    # The example sets the global providers; here they answer the look-ups for this test only.
    monkeypatch.setattr(trace, "set_tracer_provider", lambda p: installed.update(tracer=p))
    monkeypatch.setattr(metrics, "set_meter_provider", lambda p: installed.update(meter=p))
    monkeypatch.setattr(trace, "get_tracer_provider",
                        lambda: installed.get("tracer") or trace.ProxyTracerProvider())
    monkeypatch.setattr(metrics, "get_meter_provider",
                        lambda: installed.get("meter") or metrics.NoOpMeterProvider())
    namespace: dict[str, Any] = {"dsn": dsn, "refund": refund}
    exec(compile(example, f"{DOC}:Tracing", "exec"), namespace)
    assert namespace["ex"].status == "succeeded"
    out = console.getvalue()
    assert '"name": "execute_tool refund"' in out
    assert f'"gen_ai.tool.call.id": "{namespace["ex"].idempotency_key}"' in out
    assert "order-42" not in out
    assert '"name": "replaysafe.tool.executions"' in out
    assert '"name": "replaysafe.tool.duration"' in out
