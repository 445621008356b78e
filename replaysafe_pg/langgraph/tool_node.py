"""``ReplaySafeToolNode``: LangGraph's ``ToolNode`` with every tool call run through the action
ledger (docs/langgraph.md).

The interception point is the one LangGraph documents: ``wrap_tool_call`` /
``awrap_tool_call``. Each call is keyed by ``tool_call_key(thread_id, ai_message_id,
tool_call_id)`` (stable across a crash resume), so a resumed or repeated run gets the recorded
``ToolMessage`` back instead of running the tool again. A call whose outcome is ``unknown``
(or still ``running`` elsewhere at the wait timeout) comes back as an error ``ToolMessage``
that says so, never as a success.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from replaysafe_pg.errors import InvalidArgument, ReplaysafeError
from replaysafe_pg.execution import Execution, ExecutionStatus
from replaysafe_pg.keys import tool_call_key
from replaysafe_pg.ledger import AsyncLedger, Ledger

__all__ = ["ReplaySafeToolNode", "ToolCallFailed"]

# The argument a tool declares (as ``Annotated[str, InjectedToolArg]``, hidden from the model)
# to receive the call's derived idempotency key.
IDEMPOTENCY_ARG = "idempotency_key"

# The key of the call being run, from the wrapper (which gets it from the ledger) to the
# injection of the tool's arguments (ToolNode strips injected arguments a caller supplies).
_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("replaysafe_tool_key",
                                                                   default=None)


class ToolCallFailed(ReplaysafeError):
    """A replayed tool call whose recorded outcome is a failure (the tool raised an error
    that ``handle_tool_errors`` did not turn into a message). ``.error`` is what was recorded."""

    def __init__(self, message: str, *, error: Any) -> None:
        super().__init__(message)
        self.error = error


def not_known_message(call: dict[str, Any], status: str) -> str:
    """What the model reads for a call whose outcome the ledger does not know."""
    where = ("another attempt of it is still running" if status == ExecutionStatus.RUNNING
             else "an earlier attempt was interrupted before its outcome was recorded")
    return (f"The outcome of this call to {call['name']!r} is not known: {where}. It may or "
            "may not have taken effect, and it was NOT repeated. Do not assume it succeeded "
            "and do not simply call it again; tell the user the outcome is unknown and must "
            "be checked.")


def _record(message: ToolMessage) -> dict[str, Any]:
    """A ToolMessage as the ledger keeps it (JSON)."""
    record: dict[str, Any] = {"content": message.content, "status": message.status}
    if message.artifact is not None:
        try:
            json.dumps(message.artifact)
        except (TypeError, ValueError):
            record["artifact_dropped"] = True
        else:
            record["artifact"] = message.artifact
    return record


# The keys of a call's record as the node writes it (``_record``).
_RECORD_KEYS = frozenset({"content", "status", "artifact", "artifact_dropped"})


def _is_record(result: Any) -> bool:
    return (isinstance(result, dict) and {"content", "status"} <= result.keys() <= _RECORD_KEYS
            and result["status"] in ("success", "error"))


def _content(value: Any) -> Any:
    """What ToolNode makes a tool's return value into: a string or a list of content blocks
    as they are, anything else its JSON text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
            isinstance(v, str) or (isinstance(v, dict) and "type" in v) for v in value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _message(result: Any, call: dict[str, Any]) -> ToolMessage:
    """The ToolMessage of a call that succeeded: from the record the node wrote when the tool
    ran, or — for an outcome settled by reconciliation (docs/reconcile.md) — from what the
    tool would have returned, as ToolNode builds a message from a tool's return value."""
    if _is_record(result):
        return ToolMessage(content=result["content"], name=call["name"],
                           tool_call_id=call["id"], status=result["status"],
                           artifact=result.get("artifact"))
    return ToolMessage(content=_content(result), name=call["name"], tool_call_id=call["id"],
                       status="success")


class ReplaySafeToolNode(ToolNode):
    """A ``ToolNode`` whose tool calls go through ``Ledger.run`` / ``AsyncLedger.run``.

    ``ledger`` serves ``invoke``/``stream``, ``async_ledger`` serves ``ainvoke``/``astream``
    (without it, async runs use ``ledger`` through the node's sync path, blocking the event
    loop while a tool runs). Both act for their own tenant. Other keyword arguments are
    ``ToolNode``'s (``handle_tool_errors``, ``messages_key``, ``name``...); a
    ``wrap_tool_call`` / ``awrap_tool_call`` of the caller runs inside the ledger's protection.
    ``run_options`` go to every ``run`` (``lease``, ``wait_timeout``, ``on_expired``...).
    """

    def __init__(self, tools: Sequence[BaseTool | Callable[..., Any]], *,
                 ledger: Ledger | None = None, async_ledger: AsyncLedger | None = None,
                 run_options: dict[str, Any] | None = None, **tool_node_options: Any) -> None:
        if ledger is None and async_ledger is None:
            raise TypeError("ReplaySafeToolNode needs a ledger (sync runs) or an async_ledger "
                            "(async runs), or both")
        self._inner_wrap = tool_node_options.pop("wrap_tool_call", None)
        self._inner_awrap = tool_node_options.pop("awrap_tool_call", None)
        super().__init__(tools, wrap_tool_call=self._wrap,
                         awrap_tool_call=self._awrap if async_ledger is not None else None,
                         **tool_node_options)
        self.ledger = ledger
        self.async_ledger = async_ledger
        self.run_options = dict(run_options or {})

    # --- what both paths share -------------------------------------------------------------

    def _key(self, request: ToolCallRequest) -> tuple[str, str]:
        """(action key, thread id) of a call: thread, assistant message and tool call ids."""
        call = request.tool_call
        config = request.runtime.config if request.runtime is not None else {}
        thread_id = (config.get("configurable") or {}).get("thread_id")
        if thread_id is None:
            raise InvalidArgument("ReplaySafeToolNode needs a thread_id in the run's config "
                                  "(configurable.thread_id) to key its tool calls")
        call_id = call["id"]
        if not call_id:
            raise InvalidArgument("ReplaySafeToolNode needs tool calls with an id")
        message_id = self._ai_message_id(request.state, call_id)
        return tool_call_key(str(thread_id), message_id, call_id), str(thread_id)

    def _ai_message_id(self, state: Any, tool_call_id: str) -> str:
        if isinstance(state, dict):
            messages = state.get(self._messages_key, [])
        elif isinstance(state, list):
            messages = state
        else:
            messages = getattr(state, self._messages_key, [])
        for message in reversed(messages):
            if isinstance(message, AIMessage) and any(
                    tc.get("id") == tool_call_id for tc in message.tool_calls):
                if not message.id:
                    break
                return message.id
        raise InvalidArgument(
            f"ReplaySafeToolNode found no assistant message with an id for tool call "
            f"{tool_call_id!r} in the state (the key needs it; LangGraph's add_messages "
            "reducer gives every message an id)")

    def _inject_tool_args(self, tool_call: Any, tool_runtime: Any,
                          tool: BaseTool | None = None) -> Any:
        injected = super()._inject_tool_args(tool_call, tool_runtime, tool)
        key = _KEY.get()
        tool = tool or self.tools_by_name.get(tool_call["name"])
        if key is not None and tool is not None and IDEMPOTENCY_ARG in getattr(
                tool.get_input_schema(), "model_fields", {}):
            injected = {**injected, "args": {**injected["args"], IDEMPOTENCY_ARG: key}}
        return injected

    @staticmethod
    def _answer(execution: Execution, call: dict[str, Any]) -> ToolMessage:
        if execution.status == ExecutionStatus.SUCCEEDED:
            return _message(execution.result, call)
        if execution.status in (ExecutionStatus.UNKNOWN, ExecutionStatus.RUNNING):
            return ToolMessage(content=not_known_message(call, execution.status),
                               name=call["name"], tool_call_id=call["id"], status="error")
        if execution.exception is not None:
            # The tool raised in this very call: as ToolNode would, let it go on.
            raise execution.exception
        raise ToolCallFailed(
            f"tool call {call['name']!r} ({call['id']}) failed when it first ran and is not run "
            f"again: {execution.error}", error=execution.error)

    @staticmethod
    def _request(request: ToolCallRequest) -> dict[str, Any]:
        """The ledger's request (its fingerprint): the arguments the model gave the tool."""
        return {"args": dict(request.tool_call["args"])}

    def _run_options(self, thread_id: str) -> dict[str, Any]:
        # An interrupt() inside a tool is no outcome: the resumed run must run it again.
        return {"thread_id": thread_id, "retryable": lambda e: isinstance(e, GraphBubbleUp),
                **self.run_options}

    @staticmethod
    def _checked(result: ToolMessage | Command[Any]) -> ToolMessage:
        if not isinstance(result, ToolMessage):
            raise TypeError("ReplaySafeToolNode records ToolMessages only: a tool that returns "
                            "a Command cannot be replayed")
        return result

    # --- sync and async shells ---------------------------------------------------------------

    def _wrap(self, request: ToolCallRequest,
              execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
              ) -> ToolMessage | Command[Any]:
        if self.ledger is None:
            raise InvalidArgument("ReplaySafeToolNode was given only an async_ledger: run the "
                                  "graph with ainvoke/astream, or give it a ledger too")
        key, thread_id = self._key(request)
        inner = self._inner_wrap

        def run_tool(args: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
            token = _KEY.set(idempotency_key)
            try:
                result = inner(request, execute) if inner is not None else execute(request)
            finally:
                _KEY.reset(token)
            return _record(self._checked(result))

        execution = self.ledger.run(request.tool_call["name"], run_tool,
                                    self._request(request), key=key,
                                    **self._run_options(thread_id))
        return self._answer(execution, dict(request.tool_call))

    async def _awrap(self, request: ToolCallRequest,
                     execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
                     ) -> ToolMessage | Command[Any]:
        assert self.async_ledger is not None
        key, thread_id = self._key(request)
        inner = self._inner_awrap

        async def run_tool(args: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
            token = _KEY.set(idempotency_key)
            try:
                result = await (inner(request, execute) if inner is not None else execute(request))
            finally:
                _KEY.reset(token)
            return _record(self._checked(result))

        execution = await self.async_ledger.run(request.tool_call["name"], run_tool,
                                                self._request(request), key=key,
                                                **self._run_options(thread_id))
        return self._answer(execution, dict(request.tool_call))
