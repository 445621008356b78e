"""What the console reads and changes, as the connected role: the audit views (under a
tenant grant put in force first, in the same transaction), the ledger's operator functions
and the thread functions. Nothing here decides who may do what: the database does."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from replaysafe_pg import queries
from replaysafe_pg._grant import read_claims
from replaysafe_pg.errors import wrap_errors
from replaysafe_pg.ledger import Ledger
from replaysafe_pg.models import Action, ActionState, Attempt
from replaysafe_pg.threads import Threads

Connect = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]
Row = dict[str, Any]

# What an operator may settle an unknown action as (resolve), and what reopen turns.
RESOLVE_STATES = ("succeeded", "failed", "retryable")


@dataclass(frozen=True)
class Caller:
    """Who the console acts as: the role, what it acts for, and its duties."""

    role: str
    tenant_id: str | None
    all_tenants: bool
    owner: bool
    operator: bool
    auditor: bool
    grant_duties: tuple[str, ...] | None

    @property
    def can_settle(self) -> bool:
        """Whether the operator's forms are shown (the functions check it again)."""
        if self.grant_duties is not None:
            return "operator" in self.grant_duties
        return self.owner or self.operator

    @property
    def scope(self) -> str:
        if self.all_tenants:
            return "every tenant"
        return f"tenant {self.tenant_id}" if self.tenant_id is not None else "no tenant"

    @property
    def duties(self) -> str:
        if self.grant_duties is not None:
            return ", ".join(self.grant_duties) + " (tenant grant)"
        if self.owner:
            return "schema owner"
        named = [name for name, held in (("operator", self.operator), ("auditor", self.auditor))
                 if held]
        return ", ".join(named) or "worker"


@dataclass(frozen=True)
class Event:
    """One line of an action's timeline."""

    at: Any
    what: str
    detail: str = ""


class Reader:
    """The console's reads and writes on connections from ``connect``, under ``grant``."""

    def __init__(self, connect: Connect, *, grant: str | None = None) -> None:
        self._connect = connect
        self.grant = grant

    def _rows(self, conn: psycopg.Connection[Any], name: str, params: Row) -> list[Row]:
        with wrap_errors(), conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            if self.grant is not None:
                cur.execute(queries.get("use_grant", {"grant": self.grant}), {"grant": self.grant})
            return cur.execute(queries.cli(name), {"grant": self.grant, **params}).fetchall()

    def rows(self, name: str, **params: Any) -> list[Row]:
        with self._connect() as conn:
            return self._rows(conn, name, params)

    def caller(self) -> Caller:
        row = self.rows("console_caller")
        if not row:
            raise LookupError("this database has no replaysafe schema")
        r = row[0]
        duties = read_claims(self.grant).duties if self.grant is not None else None
        return Caller(role=str(r["role_name"]), tenant_id=r["tenant_id"],
                      all_tenants=bool(r["all_tenants"]), owner=bool(r["owner"]),
                      operator=bool(r["operator"]), auditor=bool(r["auditor"]),
                      grant_duties=duties)

    def _ledger(self, conn: psycopg.Connection[Any], tenant_id: str) -> Ledger:
        return Ledger(conn, tenant_id=tenant_id, grant=self.grant)

    def action(self, tenant_id: str, key: str) -> tuple[Action, list[Attempt]] | None:
        with self._connect() as conn:
            ledger = self._ledger(conn, tenant_id)
            action = ledger.get(key)
            return None if action is None else (action, ledger.attempts(key))

    def resolve(self, tenant_id: str, key: str, state: str, *, result: Any, error: Any,
                provider_reference: str | None, note: str) -> ActionState:
        with self._connect() as conn:
            return self._ledger(conn, tenant_id).resolve(
                key, state, result=result, error=error,
                provider_reference=provider_reference, note=note)

    def reopen(self, tenant_id: str, key: str, *, note: str) -> ActionState:
        with self._connect() as conn:
            return self._ledger(conn, tenant_id).reopen(key, note=note)

    def thread(self, tenant_id: str, thread_id: str, *, history: int) -> tuple[Row, list[Row]] | None:
        with self._connect() as conn:
            found = self._rows(conn, "console_thread", {"tenant_id": tenant_id,
                                                         "thread_id": thread_id})
            if not found:
                return None
            head = found[0]
            store = Threads(conn, tenant_id=tenant_id, user_id=head["user_id"], grant=self.grant)
            versions = [] if head["deleted"] else [
                dataclasses.asdict(v) for v in store.history(thread_id, limit=history)]
            return head, versions

    def langgraph(self, tenant_id: str, thread_id: str, *, limit: int) -> list[Row]:
        with self._connect() as conn, wrap_errors(), conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(queries.cli("console_langgraph_checkpoints"),
                               {"tenant_id": tenant_id, "thread_id": thread_id,
                                "limit": limit, "grant": self.grant}).fetchall()


def timeline(action: Action, attempts: list[Attempt]) -> list[Event]:
    """What happened to an action, oldest first: created, each attempt's claim and end, the
    operator's resolution (or reopening) with its note."""
    events = [Event(action.created_at, "created", f"operation {action.operation}")]
    for a in attempts:
        events.append(Event(a.claimed_at, f"attempt {a.attempt} claimed", f"by {a.worker_id}"))
        if a.ended_at is not None and a.outcome is not None:
            superseded = " (superseded: a later attempt had claimed it)" if a.superseded else ""
            events.append(Event(a.ended_at, f"attempt {a.attempt} ended: {a.outcome.value}",
                                superseded))
    if action.resolved_at is not None:
        events.append(Event(action.resolved_at, "resolved or reopened by an operator",
                            action.resolution_note or ""))
    return sorted(events, key=lambda e: e.at)
