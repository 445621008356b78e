"""The demo's support-agent worker: one OS process per run, so the demo can SIGKILL it.

A scripted agent (no LLM, no network) keeps its conversation as versioned thread state and
calls ``refund_order`` on a fake payment provider (a JSON-lines file outside the database,
like any external API). It reports what it does as JSON lines on stdout; the demo narrates.

Run as ``python -m replaysafe_pg._demo_agent`` with the configuration as JSON in the
``REPLAYSAFE_DEMO_CONFIG`` environment variable (not argv: the DSN may hold a password).

Two pieces are placeholders for the driver's own API: :func:`run_tool` does what
``Ledger.run`` does (claim, run, record, wait for a live lease), and :class:`SqlThreads` /
:class:`FileThreads` what ``Threads`` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import psycopg

from replaysafe_pg.keys import tool_call_key
from replaysafe_pg.ledger import Ledger
from replaysafe_pg.models import ClaimOutcome

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


# --- thread state ---------------------------------------------------------------------------

class ThreadStore(Protocol):
    def read(self, thread_id: str) -> tuple[int, dict[str, Any] | None]: ...

    def write(self, thread_id: str, state: dict[str, Any], expected_version: int) -> int: ...


class SqlThreads:
    """Thread state through ``replaysafe.read_thread`` / ``write_thread`` (SPEC §3)."""

    def __init__(self, dsn: str, tenant_id: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.tenant_id = tenant_id

    def read(self, thread_id: str) -> tuple[int, dict[str, Any] | None]:
        row = self.conn.execute(
            "SELECT version, state FROM replaysafe.read_thread(p_tenant_id => %s, p_thread_id => %s)",
            (self.tenant_id, thread_id)).fetchone()
        assert row is not None
        return int(row[0]), row[1]

    def write(self, thread_id: str, state: dict[str, Any], expected_version: int) -> int:
        row = self.conn.execute(
            "SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => %s, "
            "p_expected_version => %s, p_state => %s::jsonb)",
            (self.tenant_id, thread_id, expected_version, json.dumps(state))).fetchone()
        assert row is not None
        return int(row[0])


class FileThreads:
    """Compare-and-swap thread state in files, for schemas without thread state."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.dir / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def read(self, thread_id: str) -> tuple[int, dict[str, Any] | None]:
        path = self.dir / f"{thread_id}.json"
        if not path.exists():
            return 0, None
        data = json.loads(path.read_text(encoding="utf-8"))
        return int(data["version"]), data["state"]

    def write(self, thread_id: str, state: dict[str, Any], expected_version: int) -> int:
        with self._locked():
            current, _ = self.read(thread_id)
            if current != expected_version:
                raise RuntimeError(f"stale state: expected v{expected_version}, found v{current}")
            tmp = self.dir / f"{thread_id}.json.tmp"
            tmp.write_text(json.dumps({"version": current + 1, "state": state}), encoding="utf-8")
            tmp.replace(self.dir / f"{thread_id}.json")
            return current + 1


def thread_store(dsn: str, tenant_id: str, fallback_dir: Path) -> ThreadStore:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regproc('replaysafe.write_thread') IS NOT NULL").fetchone()
    if row and row[0]:
        return SqlThreads(dsn, tenant_id)
    return FileThreads(fallback_dir)


# --- running a tool through the ledger ------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    status: str  # succeeded | failed | unknown
    result: Any
    replay: bool


def run_tool(ledger: Ledger, operation: str, fn: Callable[..., dict[str, Any]],
             args: dict[str, Any], *, key: str, thread_id: str, lease: timedelta,
             emit: Emit, wait_timeout: float = 30.0) -> Outcome:
    """Claim ``key``; run ``fn`` only when the claim says so; record what happened."""
    deadline = time.monotonic() + wait_timeout
    waiting = False
    while True:
        c = ledger.claim(key, operation, args, lease=lease, thread_id=thread_id)
        if c.outcome != ClaimOutcome.RUNNING or not waiting:
            emit("claim", outcome=c.outcome.value, attempt=c.attempt,
                 idempotency_key=c.idempotency_key, lease_expires_at=c.lease_expires_at)
        if c.outcome == ClaimOutcome.CLAIMED:
            try:
                result = fn(**args, idempotency_key=c.idempotency_key)
            except Exception as exc:
                ledger.fail(key, c.attempt, {"message": str(exc)})
                return Outcome("failed", {"message": str(exc)}, replay=False)
            report = ledger.complete(key, c.attempt, result, provider_reference=result.get("refund_id"))
            emit("recorded", report=report.value, attempt=c.attempt)
            return Outcome("succeeded", result, replay=False)
        if c.outcome == ClaimOutcome.REPLAY:
            return Outcome(c.state.value, c.result if c.state == "succeeded" else c.error, replay=True)
        if c.outcome == ClaimOutcome.UNKNOWN:
            return Outcome("unknown", None, replay=False)
        # Another attempt holds a live lease: its owner may still finish. Ask again until
        # the lease runs out (then the claim itself notices the expiry).
        waiting = True
        if time.monotonic() > deadline:
            return Outcome("unknown", None, replay=False)
        time.sleep(0.2)


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
    store = thread_store(cfg["dsn"], cfg["tenant_id"], Path(cfg["threads_dir"]))
    ledger = (Ledger(cfg["dsn"], tenant_id=cfg["tenant_id"], worker_id=cfg["worker"])
              if cfg["use_ledger"] else None)

    def refund_order(order_id: str, amount_cents: int,
                     idempotency_key: str | None = None) -> dict[str, Any]:
        refund = provider.refund(order_id, amount_cents, idempotency_key=idempotency_key,
                                 metadata={"thread": thread_id})
        emit("refunded", refund_id=refund["id"], idempotency_key=idempotency_key)
        if cfg["stall_after_effect"]:
            time.sleep(600)  # the worst moment: the demo SIGKILLs us here
        return {"refund_id": refund["id"], "amount_cents": amount_cents}

    version, state = store.read(thread_id)
    emit("start", version=version, resumed=state is not None)
    if state is None:
        state = new_thread()
        version = store.write(thread_id, state, 0)
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
                outcome = Outcome("succeeded", refund_order(**call["arguments"]), replay=False)
            else:
                key = tool_call_key(thread_id, assistant["id"], call["id"])
                outcome = run_tool(ledger, call["name"], refund_order, call["arguments"], key=key,
                                   thread_id=thread_id, lease=timedelta(seconds=cfg["lease"]),
                                   emit=emit)
            emit("tool", status=outcome.status, result=outcome.result, replay=outcome.replay)
            if outcome.status == "unknown":
                return EXIT_PARKED  # do not guess: a person or a reconciler decides
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": outcome.result})
        elif step == "reply":
            refund = messages[-1]["content"]
            text = (f"Done: refunded {refund['amount_cents'] / 100:.2f} EUR "
                    f"(refund {refund['refund_id']}).")
            messages.append({"role": "assistant", "content": text})
            emit("reply", text=text)
        version = store.write(thread_id, {"messages": messages}, version)
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
