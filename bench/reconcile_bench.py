"""Reconciliation of many ``unknown`` actions with a no-op lookup, against resolving the same
number by hand with bare prepared calls of ``resolve_action``, in the same run.

    PYTHONPATH=. python bench/reconcile_bench.py [--actions 10000] [--batch 1000]

Starts its own embedded Postgres under /tmp with default (durable) settings; loads two
tenants' ``unknown`` actions directly (the owner may write the tables); then, as a bound
operator login (the role that reconciles), reconciles tenant ``rec`` batch by batch and
resolves tenant ``bare`` with one prepared statement per action. Prints seconds, actions per
second, round trips (commits) per action and the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

warnings.filterwarnings("ignore", module="platformdirs")

from replaysafe_pg import Ledger, embedded, migrate  # noqa: E402
from replaysafe_pg.reconcile import NotFound  # noqa: E402

OPERATOR = "bench_operator"

LOAD = """
INSERT INTO replaysafe.actions (tenant_id, action_key, operation, request, state, attempt,
    on_expired, idempotency_key, worker_id, lease_expires_at, created_at, updated_at)
SELECT %(tenant)s, 'k' || g, 'charge', '{"amount": 1}', 'unknown', 1, 'unknown',
       replaysafe.idempotency_key(%(tenant)s, 'k' || g), 'w', now(), now(),
       now() - interval '1 hour' + g * interval '1 ms'
FROM generate_series(1, %(n)s) g;
INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at,
    ended_at, outcome)
SELECT %(tenant)s, 'k' || g, 1, 'w', now(), now(), 'unknown' FROM generate_series(1, %(n)s) g;
"""


def commits(probe: psycopg.Connection[Any], measured: psycopg.Connection[Any]) -> int:
    """Commits in the database so far, the measured connection's flushed first (the probe's
    own reads add a small constant to both sides)."""
    measured.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.05)
    row = probe.execute("SELECT xact_commit FROM pg_stat_database "
                        "WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actions", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000, help="reconcile(limit=...)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")
    try:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute("CREATE DATABASE bench")
        owner = pg_conninfo.make_conninfo(server.dsn, dbname="bench")
        migrate(owner)
        with psycopg.connect(owner, autocommit=True) as c:
            c.execute(f"CREATE ROLE {OPERATOR} LOGIN IN ROLE replaysafe_operator")
            for tenant in ("rec", "bare"):
                for statement in LOAD.strip().split(";\n"):
                    c.execute(statement, {"tenant": tenant, "n": args.actions})
            c.execute("VACUUM ANALYZE")
        dsn = pg_conninfo.make_conninfo(owner, user=OPERATOR)
        with psycopg.connect(owner, autocommit=True) as c:
            c.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => 'rec')",
                      (OPERATOR,))

        with psycopg.connect(owner, autocommit=True) as probe, \
                psycopg.connect(dsn, autocommit=True) as conn:
            led = Ledger(conn, tenant_id="rec")
            c0, t0 = commits(probe, conn), time.perf_counter()
            settled = 0
            while batch := led.reconcile({"charge": lambda a: NotFound()}, limit=args.batch):
                settled += sum(r.outcome == "retryable" for r in batch)
            rec_s = time.perf_counter() - t0
            rec_commits = commits(probe, conn) - c0
        with psycopg.connect(owner, autocommit=True) as c:
            c.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => 'bare')",
                      (OPERATOR,))
        with psycopg.connect(owner, autocommit=True) as probe, \
                psycopg.connect(dsn, autocommit=True) as conn:
            keys = [f"k{i}" for i in range(1, args.actions + 1)]
            c0, t0 = commits(probe, conn), time.perf_counter()
            for key in keys:
                conn.execute("SELECT replaysafe.resolve_action(p_tenant_id => 'bare', "
                             "p_action_key => %s, p_state => 'retryable', p_note => 'by hand', "
                             "p_expected_attempt => 1)", (key,), prepare=True)
            bare_s = time.perf_counter() - t0
            bare_commits = commits(probe, conn) - c0
        assert settled == args.actions, settled
        n = args.actions
        print(f"# {n} unknown actions, no-op lookup, reconcile(limit={args.batch}), as a bound "
              f"operator login, fsync on\n")
        print("| | seconds | actions/s | commits per action |")
        print("|---|--:|--:|--:|")
        print(f"| `Ledger.reconcile` | {rec_s:.2f} | {n / rec_s:,.0f} | {rec_commits / n:.3f} |")
        print(f"| bare `resolve_action`, prepared | {bare_s:.2f} | {n / bare_s:,.0f} | "
              f"{bare_commits / n:.3f} |")
        print(f"\nreconcile / bare throughput: {bare_s / rec_s:.2f}x")
    finally:
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
