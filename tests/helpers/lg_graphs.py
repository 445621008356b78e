"""Small LangGraph graphs for tests/langgraph (imported only there: needs the extra)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

NODES = ("a", "b", "c")


class LogState(TypedDict):
    log: Annotated[list[str], operator.add]


def chain_graph(checkpointer: Any, ran: list[str]) -> Any:
    """a -> b -> c, each appends "<runner>:<node>" to the state and to ``ran`` (what ran, in
    this process, whatever was saved)."""

    def node(name: str) -> Callable[[LogState, RunnableConfig], dict[str, Any]]:
        def run(state: LogState, config: RunnableConfig) -> dict[str, Any]:
            runner = config["configurable"]["runner"]
            ran.append(f"{runner}:{name}")
            return {"log": [f"{runner}:{name}"]}
        return run

    g = StateGraph(LogState)
    for n in NODES:
        g.add_node(n, node(n))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(checkpointer=checkpointer)


def achain_graph(checkpointer: Any, ran: list[str]) -> Any:
    """The async twin of :func:`chain_graph`."""

    def node(name: str) -> Any:
        async def run(state: LogState, config: RunnableConfig) -> dict[str, Any]:
            runner = config["configurable"]["runner"]
            ran.append(f"{runner}:{name}")
            return {"log": [f"{runner}:{name}"]}
        return run

    g = StateGraph(LogState)
    for n in NODES:
        g.add_node(n, node(n))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(checkpointer=checkpointer)
