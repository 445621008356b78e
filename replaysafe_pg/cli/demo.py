"""``replaysafe-pg demo``: the double refund, with and without the ledger.

A support agent (:mod:`replaysafe_pg.cli.demo_agent`, one OS process per worker) refunds an
order. The demo SIGKILLs the first worker at the worst moment — the provider has refunded,
the ledger has not been told — and resumes the thread on a second worker. With the ledger
the resumed step is not run blindly: the action is ``unknown``, the reconciler
(``Ledger.reconcile`` with a lookup by idempotency key) asks the provider and settles it, and
the customer gets exactly one refund. Without the ledger the resumed step refunds again.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from psycopg.rows import dict_row

from replaysafe_pg import queries
from replaysafe_pg._conn import connectable, open_connection
from replaysafe_pg.cli import render
from replaysafe_pg.cli.demo_agent import CONFIG_ENV, CUSTOMER, EXIT_PARKED, FakePayments
from replaysafe_pg.ledger import Ledger
from replaysafe_pg.reconcile import Action, NotFound, ReconcileOutcome, Succeeded

TENANT = "demo"
EVENT_TIMEOUT = 30.0

Say = Callable[[str], None]


class DemoError(Exception):
    pass


class Worker:
    """One agent process, read event by event."""

    def __init__(self, name: str, cfg: dict[str, Any]) -> None:
        self.name = name
        env = os.environ | {CONFIG_ENV: json.dumps(cfg | {"worker": name})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "replaysafe_pg.cli.demo_agent"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            with contextlib.suppress(ValueError):
                self._events.put(json.loads(line))
        self._events.put(None)

    def events(self) -> Iterator[dict[str, Any]]:
        while True:
            try:
                event = self._events.get(timeout=EVENT_TIMEOUT)
            except queue.Empty:
                raise DemoError(f"{self.name} said nothing for {EVENT_TIMEOUT:.0f} s") from None
            if event is None:
                return
            if event["event"] == "error":
                raise DemoError(f"{self.name} failed: {event['message']}")
            yield event

    def sigkill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=EVENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.sigkill()
            raise DemoError(f"{self.name} did not finish") from None


class Story:
    def __init__(self, say: Say) -> None:
        self._say = say
        self.step = 0
        self.log: list[str] = []

    def __call__(self, text: str, *, numbered: bool = True) -> None:
        if numbered:
            self.step += 1
            text = f"  {self.step:>2}. {text}"
        self.log.append(text)
        self._say(text)


def _short(key: str | None) -> str:
    return "-" if key is None else key[:14] + "…"


def run_demo(dsn: str, *, lease: timedelta = timedelta(seconds=1.5),
             say: Say = print) -> dict[str, Any]:
    """Run the story on ``dsn`` (a migrated database); returns what happened."""
    run_id = uuid.uuid4().hex[:6]
    workdir = Path(tempfile.mkdtemp(prefix="replaysafe-demo-"))
    provider = FakePayments(workdir / "provider.jsonl")
    workers: list[Worker] = []
    base = {"dsn": dsn, "tenant_id": TENANT, "provider_file": str(provider.path),
            "lease": lease.total_seconds()}

    def spawn(name: str, thread_id: str, *, use_ledger: bool, stall: bool) -> Worker:
        w = Worker(name, base | {"thread_id": thread_id, "use_ledger": use_ledger,
                                 "stall_after_effect": stall})
        workers.append(w)
        return w

    story = Story(say)
    try:
        story(f"replaysafe-pg demo: the double refund (tenant {TENANT!r}, run {run_id})",
              numbered=False)
        with_ledger = _with_ledger(story, spawn, provider, dsn, f"support-{run_id}-ledger")
        story.step = 0
        without = _without_ledger(story, spawn, provider, f"support-{run_id}-naive")
        story("", numbered=False)
        story(f"RESULT with the ledger: {with_ledger['refunds']} refund(s) for order o_42",
              numbered=False)
        story(f"RESULT without the ledger: {without['refunds']} refund(s) for order o_42",
              numbered=False)
        audit_rows = _audit(story, dsn, with_ledger["action_key"])
        return {"run": run_id, "with_ledger": with_ledger, "without_ledger": without,
                "audit": audit_rows}
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.sigkill()
        shutil.rmtree(workdir, ignore_errors=True)


def _crash_after_refund(story: Story, worker: Worker) -> str:
    """Narrate a worker up to its refund, then SIGKILL it; returns the refund id."""
    for event in worker.events():
        kind = event["event"]
        if kind == "start":
            story(f"{worker.name} starts the conversation: \"{CUSTOMER}\"")
        elif kind == "model":
            args = ", ".join(f"{k}={v!r}" for k, v in event["arguments"].items())
            story(f"{worker.name}: the model asks for {event['tool']}({args}); "
                  f"thread state saved at v{event['version']}")
        elif kind == "claim":
            story(f"{worker.name}: ledger claim -> {event['outcome']}, attempt {event['attempt']}, "
                  f"idempotency key {_short(event['idempotency_key'])}")
        elif kind == "refunded":
            story(f"{worker.name}: provider refunded {event['refund_id']} (25.00 EUR)")
            worker.sigkill()
            story(f"SIGKILL {worker.name} (pid {worker.proc.pid}): the refund happened, "
                  "the outcome was never recorded")
            return str(event["refund_id"])
    raise DemoError(f"{worker.name} ended before refunding")


def _narrate_resume(story: Story, worker: Worker, *,
                    again: bool = False) -> tuple[int, dict[str, Any]]:
    """Narrate a resumed worker to its end; returns its exit status and the tool outcome."""
    tool: dict[str, Any] = {}
    for event in worker.events():
        kind = event["event"]
        if kind == "start" and again:
            story(f"{worker.name} resumes the thread at v{event['version']} again")
        elif kind == "start":
            story(f"{worker.name} resumes the thread at v{event['version']}: the tool call has "
                  "no result, so it runs that step again")
        elif kind == "claim":
            outcome = event["outcome"]
            if outcome == "running":
                story(f"{worker.name}: ledger claim -> running: attempt {event['attempt']} still "
                      f"holds its lease (until {event['lease_expires_at'][11:23]}); waiting")
            elif outcome == "unknown":
                story(f"{worker.name}: ledger claim -> unknown: the lease ran out without a report. "
                      "refund_order is NOT run again")
            elif outcome == "replay":
                story(f"{worker.name}: ledger claim -> replay: the recorded result is used, "
                      "refund_order is not run")
            else:
                story(f"{worker.name}: ledger claim -> {outcome}, attempt {event['attempt']}")
        elif kind == "refunded":
            story(f"{worker.name}: provider refunded {event['refund_id']} (25.00 EUR)")
        elif kind == "tool":
            tool = event
        elif kind == "reply":
            story(f"{worker.name} answers the customer: \"{event['text']}\"")
    return worker.finish(), tool


def refund_lookup(provider: FakePayments,
                  thread_id: str) -> Callable[[Action], Succeeded | NotFound]:
    """The reconciler's question to the provider: a refund under the action's idempotency
    key (the key every attempt passed downstream)? Only this run's thread is looked up: an
    older demo run's provider file is gone, and "gone" is not "not found"."""

    def lookup(action: Action) -> Succeeded | NotFound:
        if action.thread_id != thread_id:
            raise LookupError("not an action of this demo run: its provider is gone")
        found = provider.find(idempotency_key=action.idempotency_key)
        if not found:
            return NotFound()
        refund = found[0]
        return Succeeded({"refund_id": refund["id"], "amount_cents": refund["amount_cents"]},
                         provider_reference=refund["id"])

    return lookup


def _with_ledger(story: Story, spawn: Callable[..., Worker], provider: FakePayments, dsn: str,
                 thread_id: str) -> dict[str, Any]:
    story("", numbered=False)
    story("WITH the ledger (replaysafe_pg)", numbered=False)
    _crash_after_refund(story, spawn("worker-1", thread_id, use_ledger=True, stall=True))

    status, tool = _narrate_resume(story, spawn("worker-2", thread_id, use_ledger=True, stall=False))
    if status != EXIT_PARKED or tool.get("status") != "unknown":
        raise DemoError(f"expected worker-2 to park the thread as unknown (exit {status}, {tool})")
    story("worker-2 parks the thread: the outcome must be reconciled first")

    with open_connection(connectable(dsn), given=(dsn,), autocommit=True,
                         prepare_threshold=None) as conn:
        rows = conn.cursor(row_factory=dict_row).execute(
            queries.cli("unresolved_actions"), {"tenant_id": TENANT}).fetchall()
        mine = [r for r in rows if r["thread_id"] == thread_id]
        story(f"`replaysafe-pg audit` flags it (exit status 1): {len(mine)} unresolved action, "
              f"state {mine[0]['state'] if mine else '?'}")
        if not mine:
            raise DemoError("the interrupted refund is not among the unresolved actions")
        ledger = Ledger(conn, tenant_id=TENANT)
        results = ledger.reconcile({"refund_order": refund_lookup(provider, thread_id)})
        done = next((r for r in results if r.action_key == mine[0]["action_key"]), None)
        if done is None or done.outcome is ReconcileOutcome.ERROR:
            raise DemoError(f"the reconciler did not settle the refund: {done}")
        action = ledger.get(done.action_key)
        assert action is not None
        story("the reconciler (Ledger.reconcile, as `replaysafe-pg reconcile` runs it) asks the "
              f"provider for a refund under idempotency key {_short(action.idempotency_key)}: "
              + (f"found {done.provider_reference}" if done.provider_reference else "none"))
        story(f"the action becomes {done.outcome.value}, note \"{done.note}\"; "
              f"attempt {done.attempt} stays recorded as unknown")

    status, tool = _narrate_resume(story, spawn("worker-2", thread_id, use_ledger=True, stall=False),
                                   again=True)
    if status != 0:
        raise DemoError(f"worker-2 did not finish the conversation (exit {status})")
    refunds = provider.find(thread=thread_id)
    story(f"the provider shows {len(refunds)} refund(s) for order o_42: "
          + ("exactly one. OK" if len(refunds) == 1 else "MORE THAN ONE"))
    return {"refunds": len(refunds), "refund_ids": [r["id"] for r in refunds],
            "action_key": action.action_key, "idempotency_key": action.idempotency_key}


def _without_ledger(story: Story, spawn: Callable[..., Worker], provider: FakePayments,
                    thread_id: str) -> dict[str, Any]:
    story("", numbered=False)
    story("WITHOUT the ledger (the same agent calls refund_order directly)", numbered=False)
    _crash_after_refund(story, spawn("worker-1", thread_id, use_ledger=False, stall=True))
    status, _tool = _narrate_resume(story, spawn("worker-2", thread_id, use_ledger=False, stall=False))
    if status != 0:
        raise DemoError(f"worker-2 did not finish the conversation (exit {status})")
    refunds = provider.find(thread=thread_id)
    story(f"the provider shows {len(refunds)} refund(s) for order o_42: "
          + ("the customer was refunded twice" if len(refunds) > 1 else "one"))
    return {"refunds": len(refunds), "refund_ids": [r["id"] for r in refunds]}


def _audit(story: Story, dsn: str, action_key: str) -> dict[str, Any]:
    with open_connection(connectable(dsn), given=(dsn,), autocommit=True,
                         prepare_threshold=None) as conn:
        ledger = Ledger(conn, tenant_id=TENANT)
        action = ledger.get(action_key)
        attempts = ledger.attempts(action_key)
        cur = conn.cursor(row_factory=dict_row)
        unresolved = [r for r in cur.execute(queries.cli("unresolved_actions"),
                                             {"tenant_id": TENANT}).fetchall()
                      if r["action_key"] == action_key]
        multi = [r for r in cur.execute(queries.cli("multi_effect_actions"),
                                        {"tenant_id": TENANT}).fetchall()
                 if r["action_key"] == action_key]
    assert action is not None
    story("", numbered=False)
    story("Audit rows for the ledger run (replaysafe.actions_v, action_attempts_v):", numbered=False)
    story(render.table([render.jsonable(action) | {"state": action.state.value}],
                       ["action_key", "operation", "state", "attempt", "provider_reference",
                        "resolution_note"], cut_at={"resolution_note": 80}), numbered=False)
    story(render.table([render.jsonable(a) | {"outcome": a.outcome} for a in attempts],
                       ["attempt", "worker_id", "outcome", "superseded", "error"]), numbered=False)
    story(f"unresolved_actions: {len(unresolved)} row(s); multi_effect_actions: {len(multi)} "
          "row(s)", numbered=False)
    return {"action": render.jsonable(action), "attempts": render.jsonable(attempts),
            "unresolved_actions": render.jsonable(unresolved),
            "multi_effect_actions": render.jsonable(multi)}

