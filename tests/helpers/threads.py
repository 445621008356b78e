"""Helpers for the thread tests: ``increment`` must be importable from spawned processes;
``table_counts`` counts what the owner stores."""

from __future__ import annotations

from typing import Any

import psycopg

from replaysafe_pg import StaleStateError, Threads


def increment(dsn: str, tenant_id: str, thread_id: str, writer: str,
              times: int) -> tuple[list[int], int]:
    """Read -> modify -> write ``times`` increments, retrying on StaleStateError.

    Returns the versions this writer created and how many stale writes it saw.
    """
    versions: list[int] = []
    stale = 0
    with Threads(dsn, tenant_id=tenant_id) as threads:
        for _ in range(times):
            while True:
                current = threads.read(thread_id)
                state: dict[str, Any] = current.state or {"n": 0, "by": {}}
                by = dict(state["by"])
                by[writer] = by.get(writer, 0) + 1
                try:
                    versions.append(threads.write(thread_id, {"n": state["n"] + 1, "by": by},
                                                  current.version, history_limit=2000))
                except StaleStateError:
                    stale += 1
                    continue
                break
    return versions, stale


def table_counts(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Rows of replaysafe.threads and replaysafe.thread_versions (on an owner's connection)."""
    row = conn.execute("SELECT (SELECT count(*) FROM replaysafe.threads), "
                       "(SELECT count(*) FROM replaysafe.thread_versions)").fetchone()
    assert row is not None
    return row[0], row[1]
