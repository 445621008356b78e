"""LangGraph drop-in (extra ``langgraph``; docs/langgraph.md).

- :class:`ReplaysafeSaver` / :class:`AsyncReplaysafeSaver`: checkpointers whose tables come
  with this project's migrations; two runs on one thread cannot fork it silently (the loser
  gets :class:`StaleCheckpointError`, a ``StaleStateError``).
- :class:`ReplaySafeToolNode`: a ``ToolNode`` whose every tool call goes through the action
  ledger, so a resumed or repeated run replays recorded calls instead of running them again.

The core package never imports this module: ``import replaysafe_pg`` needs no LangGraph.
"""

from replaysafe_pg.errors import StaleCheckpointError
from replaysafe_pg.langgraph.saver import AsyncReplaysafeSaver, ReplaysafeSaver
from replaysafe_pg.langgraph.tool_node import ReplaySafeToolNode, ToolCallFailed

__all__ = ["AsyncReplaysafeSaver", "ReplaySafeToolNode", "ReplaysafeSaver",
           "StaleCheckpointError", "ToolCallFailed"]
