"""ReplaySafeToolNode: a tool call runs at most once per (thread, assistant message, tool
call), across crashes, repeated runs and time travel; an unknown outcome reaches the model as
an error that says so."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from helpers.lg_agent import CHARGE, agent_graph, make_tools
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.prebuilt import ToolNode

from replaysafe_pg import AsyncLedger, Ledger
from replaysafe_pg.keys import tool_call_key
from replaysafe_pg.langgraph import (
    AsyncReplaysafeSaver,
    ReplaysafeSaver,
    ReplaySafeToolNode,
)

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def agent(dsn: str, thread_id: str, effects: Path, kind: str, phase: str,
          hold: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}",
           "PYTHONWARNINGS": "ignore", "HOLD_AFTER_EFFECT": "1" if hold else "0"}
    return subprocess.Popen([sys.executable, "-m", "helpers.lg_agent", dsn, thread_id,
                             str(effects), kind, phase], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize(("kind", "expected_effects"), [("ours", 1), ("plain", 2)])
def test_sigkill_after_the_side_effect_then_resume(dsn: str, tmp_path: Path, kind: str,
                                                    expected_effects: int) -> None:
    effects = tmp_path / "effects.txt"
    thread_id = str(uuid.uuid4())
    first = agent(dsn, thread_id, effects, kind, "start", hold=True)
    deadline = time.monotonic() + 30
    while not lines(effects):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the tool never ran"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)

    second = agent(dsn, thread_id, effects, kind, "resume")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    charges = [x for x in lines(effects) if x.startswith("charge")]
    assert len(charges) == expected_effects, charges
    if kind == "ours":
        # Never a success: the model is told the outcome is not known and nothing was repeated.
        assert out.startswith("TOOL error") and "not known" in out and "NOT repeated" in out, out


def run_graph(dsn: str, effects: Path, node: Any, calls: list[dict[str, Any]],
              thread_id: str) -> Any:
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        graph = agent_graph(saver, node, calls)
        config = {"configurable": {"thread_id": thread_id}}
        out = graph.invoke({"messages": [HumanMessage("go")]}, config, durability="sync")
        # Time travel to the checkpoint before the tools ran: they run again in a new branch.
        before_tools = next(s for s in graph.get_state_history(config) if s.next == ("tools",))
        again = graph.invoke(None, before_tools.config, durability="sync")
        return out, again


def test_repeated_runs_replay_recorded_calls_each_on_its_own_key(dsn: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    calls = [*CHARGE, {"name": "lookup", "args": {"order": "o1"}, "id": "call_lookup",
                       "type": "tool_call"}]
    thread_id = str(uuid.uuid4())
    with Ledger(dsn, tenant_id="t1") as ledger:
        node = ReplaySafeToolNode(make_tools(str(effects)), ledger=ledger)
        out, again = run_graph(dsn, effects, node, calls, thread_id)
        assert sorted(x.split()[0] for x in lines(effects)) == ["charge", "lookup"]
        first = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        replayed = [m for m in again["messages"] if isinstance(m, ToolMessage)][-2:]
        assert [(m.content, m.status) for m in first] == [(m.content, m.status) for m in replayed]
        ai_id = next(m.id for m in out["messages"] if getattr(m, "tool_calls", None))
        charge = ledger.get(tool_call_key(thread_id, ai_id, "call_charge"))
        lookup = ledger.get(tool_call_key(thread_id, ai_id, "call_lookup"))
        assert charge is not None and lookup is not None
        assert charge.state == lookup.state == "succeeded" and charge.attempt == 1
        # The charge tool declared idempotency_key: it got the derived key.
        assert lines(effects)[[x.split()[0] for x in lines(effects)].index("charge")] \
            == f"charge 500 {charge.idempotency_key}"


def test_control_plain_tool_node_runs_the_calls_again(dsn: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    run_graph(dsn, effects, ToolNode(make_tools(str(effects))), list(CHARGE), str(uuid.uuid4()))
    assert len(lines(effects)) == 2


def test_an_unknown_outcome_reaches_the_model_as_an_error(dsn: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    thread_id = str(uuid.uuid4())
    with Ledger(dsn, tenant_id="t1") as ledger, ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        node = ReplaySafeToolNode(make_tools(str(effects)), ledger=ledger)
        graph = agent_graph(saver, node, CHARGE)
        config = {"configurable": {"thread_id": thread_id}}
        graph.invoke({"messages": [HumanMessage("go")]}, config, durability="sync",
                     interrupt_before=["tools"])
        ai = graph.get_state(config).values["messages"][-1]
        key = tool_call_key(thread_id, ai.id, "call_charge")
        claim = ledger.claim(key, "charge", {"args": {"amount": 500}}, thread_id=thread_id)
        ledger.mark_unknown(claim, {"message": "timeout"})
        out = graph.invoke(None, config, durability="sync")
    message = [m for m in out["messages"] if isinstance(m, ToolMessage)][-1]
    assert message.status == "error" and "not known" in message.content
    assert lines(effects) == []


def test_handle_tool_errors_keeps_toolnode_semantics(dsn: str, tmp_path: Path) -> None:
    from langchain_core.tools import tool

    @tool
    def broken(x: int) -> str:
        """Always fails."""
        raise ValueError("provider said no")

    calls = [{"name": "broken", "args": {"x": 1}, "id": "call_b", "type": "tool_call"}]
    with Ledger(dsn, tenant_id="t1") as ledger, ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        handled = agent_graph(saver, ReplaySafeToolNode([broken], ledger=ledger,
                                                        handle_tool_errors=True), calls)
        out = handled.invoke({"messages": [HumanMessage("go")]},
                             {"configurable": {"thread_id": str(uuid.uuid4())}})
        message = [m for m in out["messages"] if isinstance(m, ToolMessage)][-1]
        assert message.status == "error" and "provider said no" in message.content
        raising = agent_graph(saver, ReplaySafeToolNode([broken], ledger=ledger,
                                                        handle_tool_errors=False), calls)
        with pytest.raises(ValueError, match="provider said no"):
            raising.invoke({"messages": [HumanMessage("go")]},
                           {"configurable": {"thread_id": str(uuid.uuid4())}})


def test_async_flavour_replays_too(dsn: str, tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"

    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1") as ledger, \
                AsyncReplaysafeSaver(dsn, tenant_id="t1") as saver:
            node = ReplaySafeToolNode(make_tools(str(effects)), async_ledger=ledger)
            graph = agent_graph(saver, node, CHARGE)
            config = {"configurable": {"thread_id": str(uuid.uuid4())}}
            await graph.ainvoke({"messages": [HumanMessage("go")]}, config, durability="sync")
            history = [s async for s in graph.aget_state_history(config)]
            before_tools = next(s for s in history if s.next == ("tools",))
            again = await graph.ainvoke(None, before_tools.config, durability="sync")
            assert [m for m in again["messages"] if isinstance(m, ToolMessage)][-1].status \
                == "success"

    asyncio.run(main())
    assert len(lines(effects)) == 1


def test_a_reconciled_call_replays_as_what_the_tool_would_have_returned(
        dsn: str, tmp_path: Path) -> None:
    """docs/reconcile.md: the lookup answers what the tool would have returned; the node
    builds the ToolMessage from it, and the thread goes on from before the tool node (time
    travel), the tool not run again."""
    from replaysafe_pg.reconcile import Succeeded

    effects = tmp_path / "effects.txt"
    thread_id = str(uuid.uuid4())
    with Ledger(dsn, tenant_id="t1") as ledger, ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        node = ReplaySafeToolNode(make_tools(str(effects)), ledger=ledger)
        graph = agent_graph(saver, node, CHARGE)
        config = {"configurable": {"thread_id": thread_id}}
        graph.invoke({"messages": [HumanMessage("go")]}, config, durability="sync",
                     interrupt_before=["tools"])
        ai = graph.get_state(config).values["messages"][-1]
        key = tool_call_key(thread_id, ai.id, "call_charge")
        claim = ledger.claim(key, "charge", {"args": {"amount": 500}}, thread_id=thread_id)
        ledger.mark_unknown(claim, {"message": "crashed after the charge"})
        out = graph.invoke(None, config, durability="sync")  # the model hears "unknown"
        assert "not known" in [m for m in out["messages"] if isinstance(m, ToolMessage)][-1].content

        # docs/reconcile.md#a-langgraph-tool-call, as written.
        text = (ROOT / "docs" / "reconcile.md").read_text()
        section = text.split("## A LangGraph tool call", 1)[1]
        example = re.search(r"```python\n(.*?)```", section, re.S)
        assert example is not None
        names: dict[str, Any] = {"ledger": ledger, "graph": graph, "config": config,
                                 "Succeeded": Succeeded}
        exec(compile(example.group(1), "docs/reconcile.md", "exec"), names)
        assert ledger.get(key).state == "succeeded"  # type: ignore[union-attr]
        out = names["out"]
    message = [m for m in out["messages"] if isinstance(m, ToolMessage)][-1]
    assert (message.status, message.content) == ("success", '{"charged": 500}')
    assert out["messages"][-1].content == """done: ['{"charged": 500}']"""
    assert lines(effects) == []


@pytest.mark.parametrize(("returned", "content"), [
    ("charged 500", "charged 500"),
    ({"content": "x"}, '{"content": "x"}'),
    ([1, 2], "[1, 2]"),
    ([{"type": "text", "text": "hi"}], [{"type": "text", "text": "hi"}]),
])
def test_a_reconciled_result_becomes_the_messages_content_as_toolnode_would(
        returned: Any, content: Any) -> None:
    from replaysafe_pg.langgraph.tool_node import _message

    call = {"name": "charge", "id": "c1"}
    assert _message(returned, call).content == content
    record = {"content": "charged 500", "status": "success"}
    assert _message(record, call).content == "charged 500", "the node's own records replay"
