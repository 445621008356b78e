"""A ReAct-style agent with a scripted model (no LLM) for tests/langgraph, runnable as a
script for the crash tests:

    python -m helpers.lg_agent DSN THREAD_ID EFFECTS_FILE {ours,plain} {start,resume}

Each side effect of a tool appends one line to EFFECTS_FILE (flushed and fsynced). With
``HOLD_AFTER_EFFECT=1`` the charge tool then waits, so the parent can SIGKILL the process
after the effect and before anything is recorded.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolArg, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode


def effect(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def make_tools(effects: str) -> list[Any]:
    @tool
    def charge(amount: int, idempotency_key: Annotated[str, InjectedToolArg] = "") -> str:
        """Charge the customer ``amount`` cents."""
        effect(effects, f"charge {amount} {idempotency_key}")
        if os.environ.get("HOLD_AFTER_EFFECT") == "1":
            time.sleep(60)
        return f"charged {amount}"

    @tool
    def lookup(order: str) -> str:
        """Look an order up (no side effect worth protecting, but keyed all the same)."""
        effect(effects, f"lookup {order}")
        return f"order {order}: shipped"

    return [charge, lookup]


def scripted_model(calls: Sequence[dict[str, Any]]) -> Any:
    """First turn: the given tool calls; after the tool results: a final answer."""

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            return {"messages": [AIMessage(content="", tool_calls=list(calls))]}
        results = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
        return {"messages": [AIMessage(content=f"done: {results}")]}

    return agent


def route(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def agent_graph(checkpointer: Any, tool_node: Any, calls: Sequence[dict[str, Any]]) -> Any:
    g = StateGraph(MessagesState)
    g.add_node("agent", scripted_model(calls))
    g.add_node("tools", tool_node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


CHARGE = [{"name": "charge", "args": {"amount": 500}, "id": "call_charge", "type": "tool_call"}]


def main(argv: list[str]) -> None:
    dsn, thread_id, effects, kind, phase = argv
    from replaysafe_pg import Ledger
    from replaysafe_pg.langgraph import ReplaysafeSaver, ReplaySafeToolNode

    with ReplaysafeSaver(dsn, tenant_id="t1") as saver, \
            Ledger(dsn, tenant_id="t1", worker_id=f"agent-{os.getpid()}") as ledger:
        tools = make_tools(effects)
        node = (ReplaySafeToolNode(tools, ledger=ledger,
                                   run_options={"lease": 1.0, "wait_timeout": 10.0})
                if kind == "ours" else ToolNode(tools))
        graph = agent_graph(saver, node, CHARGE)
        config = {"configurable": {"thread_id": thread_id}}
        inputs = {"messages": [HumanMessage("charge me")]} if phase == "start" else None
        out = graph.invoke(inputs, config, durability="sync")
        last_tool = [m for m in out["messages"] if isinstance(m, ToolMessage)][-1]
        print(f"TOOL {last_tool.status} {last_tool.content}")


if __name__ == "__main__":
    main(sys.argv[1:])
