"""The demo's support-agent worker: one OS process per run, so the demo can SIGKILL it.

A scripted agent (no LLM, no network) keeps its conversation as versioned thread state and
calls ``refund_order`` on a fake payment provider (a JSON-lines file outside the database,
like any external API). It reports what it does as JSON lines on stdout; the demo narrates.

Run as ``python -m replaysafe_pg.cli.demo_agent`` with the configuration as JSON in the
``REPLAYSAFE_DEMO_CONFIG`` environment variable (not argv: the DSN may hold a password).

The tool runs through ``Ledger.run`` (claim, run, record; wait for a live lease) and the
conversation is kept with ``Threads`` (compare-and-swap writes).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from replaysafe_pg.execution import ExecutionStatus
from replaysafe_pg.keys import tool_call_key
from replaysafe_pg.ledger import Ledger
from replaysafe_pg.models import ActionState
from replaysafe_pg.threads import Threads

CONFIG_ENV = "REPLAYSAFE_DEMO_CONFIG"
EXIT_PARKED = 3  # the thread waits for reconciliation

Emit = Callable[..., None]


# --- the outside world ----------------------------------------------------------------------

class FakePayments:
    """A payment provider that does NOT deduplicate (many real APIs do not): every call
    refunds. It stores the idempotency key it is given, as metadata one can search by."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def refund(self, order_id: str, amount_cents: int, *, idempotency_key: str | None,
               metadata: dict[str, str]) -> dict[str, Any]:
        refund = {"id": "re_" + uuid.uuid4().hex[:10], "order_id": order_id,
                  "amount_cents": amount_cents, "idempotency_key": idempotency_key,
                  "metadata": metadata}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(refund) + "\n")
            f.flush()
            os.fsync(f.fileno())  # the money has left: durable before we answer
        return refund

    def all(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def find(self, *, idempotency_key: str | None = None,
             thread: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.all()
                if (idempotency_key is None or r["idempotency_key"] == idempotency_key)
                and (thread is None or r["metadata"].get("thread") == thread)]


# --- the scripted agent ---------------------------------------------------------------------

CUSTOMER = "I was charged twice for order o_42. Please refund the duplicate (25.00 EUR)."
REFUND_ARGS = {"order_id": "o_42", "amount_cents": 2500}


def new_thread() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": CUSTOMER}]}


def next_step(state: dict[str, Any]) -> str:
    """The scripted model: ask for the refund, then (with its result) answer the customer."""
    messages = state["messages"]
    last = messages[-1]
    if last["role"] == "user":
        return "call_model"
    if last["role"] == "assistant" and last.get("tool_calls"):
        return "run_tool"
    if last["role"] == "tool":
        return "reply"
    return "done"


def agent(cfg: dict[str, Any], emit: Emit) -> int:
    thread_id: str = cfg["thread_id"]
    provider = FakePayments(Path(cfg["provider_file"]))
    threads = Threads(cfg["dsn"], tenant_id=cfg["tenant_id"])
    ledger = (Ledger(cfg["dsn"], tenant_id=cfg["tenant_id"], worker_id=cfg["worker"])
              if cfg["use_ledger"] else None)
    key = ""

    def refund_order(order_id: str, amount_cents: int,
                     idempotency_key: str | None = None) -> dict[str, Any]:
        if ledger is not None:
            mine = ledger.get(key)  # narration only: the attempt this call just claimed
            emit("claim", outcome="claimed", attempt=mine.attempt if mine else None,
                 idempotency_key=idempotency_key)
        refund = provider.refund(order_id, amount_cents, idempotency_key=idempotency_key,
                                 metadata={"thread": thread_id})
        emit("refunded", refund_id=refund["id"], idempotency_key=idempotency_key)
        if cfg["stall_after_effect"]:
            time.sleep(600)  # the worst moment: the demo SIGKILLs us here
        return {"refund_id": refund["id"], "amount_cents": amount_cents}

    current = threads.read(thread_id)
    version, state = current.version, current.state
    emit("start", version=version, resumed=state is not None)
    if state is None:
        state = new_thread()
        version = threads.write(thread_id, state, expected_version=0)
    while (step := next_step(state)) != "done":
        messages = list(state["messages"])
        if step == "call_model":
            call = {"id": "call_1", "name": "refund_order", "arguments": REFUND_ARGS}
            messages.append({"role": "assistant", "id": "msg_1", "tool_calls": [call]})
            emit("model", tool="refund_order", arguments=REFUND_ARGS, version=version + 1)
        elif step == "run_tool":
            assistant = messages[-1]
            call = assistant["tool_calls"][0]
            if ledger is None:
                status, result, replay = "succeeded", refund_order(**call["arguments"]), False
            else:
                key = tool_call_key(thread_id, assistant["id"], call["id"])
                before = ledger.get(key)
                if before is not None and before.state == ActionState.RUNNING:
                    emit("claim", outcome="running", attempt=before.attempt,
                         idempotency_key=before.idempotency_key,
                         lease_expires_at=before.lease_expires_at)
                ex = ledger.run(call["name"], refund_order, call["arguments"], key=key,
                                thread_id=thread_id, lease=timedelta(seconds=cfg["lease"]),
                                wait_timeout=30.0)
                if ex.replay:
                    emit("claim", outcome="replay" if ex.status != ExecutionStatus.UNKNOWN
                         else "unknown", attempt=ex.attempt, idempotency_key=ex.idempotency_key)
                status, result, replay = str(ex.status), ex.result, ex.replay
                if ex.status == ExecutionStatus.FAILED:
                    result = ex.error
            emit("tool", status=status, result=result, replay=replay)
            if status != "succeeded":
                return EXIT_PARKED  # do not guess: a person or a reconciler decides
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        elif step == "reply":
            refund = messages[-1]["content"]
            text = (f"Done: refunded {refund['amount_cents'] / 100:.2f} EUR "
                    f"(refund {refund['refund_id']}).")
            messages.append({"role": "assistant", "content": text})
            emit("reply", text=text)
        version = threads.write(thread_id, {"messages": messages}, expected_version=version)
        state = {"messages": messages}
    emit("done", version=version)
    return 0


def main() -> int:
    cfg = json.loads(os.environ[CONFIG_ENV])

    def emit(event: str, **data: Any) -> None:
        print(json.dumps({"event": event, **data}, default=str), flush=True)

    try:
        return agent(cfg, emit)
    except Exception as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
