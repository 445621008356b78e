"""Does latency stay flat as the ledger grows? 10 thousand, 1 million and 10 million actions,
side by side, measured interleaved in one run.

    PYTHONPATH=. python bench/scale_bench.py [--sizes 10k,1M,10M] [--samples 300]
        [--data-dir /tmp/replaysafe-scale] [--reuse] [--keep-server] [--open-per-mille 1]

One embedded Postgres (durable default settings but ``shared_buffers`` 1 GB), one database per
size. Each is migrated to head, then bulk-loaded by the schema owner writing the tables
directly (``INSERT ... SELECT generate_series``, secondary indexes dropped during the load and
re-created, then ``VACUUM ANALYZE``): several hundred tenants. The measured tenant's actions:
97 % succeeded, 2 % failed, 0.5 % unknown, 0.5 % running with an expired lease (what a sweep
finds). The other tenants': ``--open-per-mille`` (default 1, so 0.1 %) not terminal, a third
each unknown, running with an expired lease and retryable, the rest 97:3 succeeded and failed
(a ledger's non-terminal rows are the work in flight or stuck, not a share of its history).
One attempt row per action, a second successful one for 0.1 % (multi-effect); one thread per
ten actions, three kept versions each. Building the 10 M set takes minutes: ``--reuse`` keeps the server and
its databases in ``--data-dir`` for the next run (a reused database is only migrated to head).

The measured tenant, ``bench``, holds the same 3,000 actions and 300 threads in every database:
the other tenants make the difference. So every figure compares the same work for the caller
against a table 10, 1,000 or 10,000 times larger — an operation that stays index-driven and
tenant-bounded stays flat; one that scans, or filters other tenants' rows, grows.

Everything is measured as logins, the real case: a LOGIN role in ``replaysafe_worker`` bound to
``bench`` (claims, reports, threads, a tenant's sweep, the audit views) and one in
``replaysafe_operator`` bound to it (its tenant's purge); sweep and purge of every tenant run
as the schema owner (a maintenance job). Sweep and purge batches run inside a transaction that
is rolled back, so every sample faces the same rows (each checks it found work). Per
operation: p50 and p99 in µs, client-observed (one round trip each), and the ratio of each
size's p50 to the 10 k figure. Last line: ``scale: worst p50 ratio 10M/10k = X (op)``.

``metrics()`` is measured three ways: the bound worker's ``SELECT * FROM replaysafe.metrics()``
(its tenant's rows), and a LOGIN role in ``replaysafe_auditor`` bound to every tenant
(``bind_role_to_all_tenants``) with ``p_by_tenant => true`` (a row set per tenant with any
non-terminal action) and ``=> false`` (totals). The all-tenant calls count every tenant's
non-terminal rows exactly, so they grow with those rows (``--open-per-mille``), not with the
terminal ones; the rows each call returned are printed per size.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

warnings.filterwarnings("ignore", module="platformdirs")

SIZES = {"10k": 10_000, "100k": 100_000, "1M": 1_000_000, "10M": 10_000_000}
TENANT = "bench"
BENCH_ACTIONS = 3_000
BENCH_THREADS = 300
OTHER_TENANTS = 299
WORKER = "scale_worker"
OPERATOR = "scale_operator"
AUDITOR = "scale_auditor"
SETTINGS = {"shared_buffers": "1GB", "max_wal_size": "8GB", "checkpoint_timeout": "30min",
            "maintenance_work_mem": "1GB"}
REQUEST_SQL = "jsonb_build_object('order', i, 'amount_cents', 1250, 'currency', 'EUR')"

# Every action i: tenant "bench" for i < BENCH_ACTIONS, else one of OTHER_TENANTS in contiguous
# blocks (inserted in primary-key order). Timestamps spread over 90 days, pseudo-randomly. Every
# table is generated from the same series (never by scanning what was loaded before).
ACTION_OF_I = f"""
LATERAL (SELECT
    CASE WHEN i < {BENCH_ACTIONS} THEN 'bench'
         ELSE 't' || lpad(((i - {BENCH_ACTIONS}) * {OTHER_TENANTS}
                           / greatest(%(n)s - {BENCH_ACTIONS}, 1))::text, 4, '0') END
        AS tenant_id,
    'k' || lpad(i::text, 9, '0') AS action_key,
    (CASE WHEN i < {BENCH_ACTIONS} THEN
              CASE WHEN i %% 100 < 97 THEN 'succeeded' WHEN i %% 100 < 99 THEN 'failed'
                   WHEN (i / 100) %% 2 = 0 THEN 'unknown' ELSE 'running' END
          WHEN i %% 1000 < %(open)s THEN
              CASE (i / 1000) %% 3 WHEN 0 THEN 'unknown' WHEN 1 THEN 'running' ELSE 'retryable' END
          WHEN i %% 100 < 97 THEN 'succeeded' ELSE 'failed' END)::replaysafe.action_state AS state,
    now() - interval '90 days' * ((i * 7919) %% 1000003) / 1000003.0 - interval '1 hour' AS at) s,
LATERAL (SELECT
    CASE WHEN i %% 1000 = 1 AND s.state = 'succeeded' THEN 2 ELSE 1 END AS attempts,
    CASE WHEN s.state = 'succeeded' THEN jsonb_build_object('refund_id', 're_' || i, 'status', 'ok') END
        AS result,
    CASE WHEN s.state = 'failed' THEN jsonb_build_object('type', 'Declined', 'message', 'declined') END
        AS error) r
"""

LOAD_ACTIONS = f"""
INSERT INTO replaysafe.actions (tenant_id, action_key, thread_id, operation, request, state,
    attempt, on_expired, idempotency_key, worker_id, lease_expires_at, result, error,
    created_at, updated_at, completed_at)
SELECT s.tenant_id, s.action_key, 'th' || lpad((i / 10)::text, 8, '0'), 'refund', {REQUEST_SQL},
       s.state, r.attempts, 'unknown', 'rs1_' || md5(i::text) || md5((i + 1)::text), 'loader',
       s.at + interval '30 seconds', r.result, r.error, s.at, s.at + interval '1 second',
       CASE WHEN s.state IN ('succeeded', 'failed') THEN s.at + interval '1 second' END
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i, {ACTION_OF_I}
"""

LOAD_ATTEMPTS = f"""
INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at,
    ended_at, outcome, superseded, result, error)
SELECT s.tenant_id, s.action_key, n, 'loader', s.at,
       CASE WHEN s.state <> 'running' THEN s.at + interval '1 second' END,
       CASE WHEN s.state <> 'running' THEN s.state END,
       n < r.attempts, r.result, r.error
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i, {ACTION_OF_I},
     generate_series(1, r.attempts) AS n
"""

# One thread per ten actions (the tenant of its first action), three kept versions.
LOAD_THREADS = f"""
INSERT INTO replaysafe.threads (tenant_id, thread_id, user_id, version, history_limit, oldest_kept,
    created_at, updated_at)
SELECT s.tenant_id, 'th' || lpad((i / 10)::text, 8, '0'), NULL, 3, 20, 1, s.at, s.at
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1, 10) AS i, {ACTION_OF_I}
"""

LOAD_VERSIONS = f"""
INSERT INTO replaysafe.thread_versions (tenant_id, thread_id, version, state, created_at)
SELECT s.tenant_id, 'th' || lpad((i / 10)::text, 8, '0'), v,
       jsonb_build_object('step', v, 'messages', jsonb_build_array('hello', 'refund o_42', 'done')),
       s.at
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1, 10) AS i, {ACTION_OF_I},
     generate_series(1, 3) AS v
"""

CHUNK = 1_000_000


def load(dsn: str, n: int, open_per_mille: int) -> float:
    """Bulk-load ``n`` actions (with attempts, threads and versions); seconds taken."""
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET synchronous_commit = off")
        indexes = c.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'replaysafe' "
            "AND tablename IN ('actions', 'action_attempts', 'threads', 'thread_versions') "
            "AND indexname NOT LIKE '%_pkey'").fetchall()
        for name, _ in indexes:
            c.execute(f"DROP INDEX replaysafe.{name}")
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            for sql in (LOAD_ACTIONS, LOAD_ATTEMPTS, LOAD_THREADS, LOAD_VERSIONS):
                c.execute(sql, {"lo": lo, "hi": hi, "n": n, "open": open_per_mille})
            print(f"  loaded {hi:,} / {n:,} actions ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr)
        for _, definition in indexes:
            c.execute(definition)
        c.execute("VACUUM ANALYZE replaysafe.actions, replaysafe.action_attempts, "
                  "replaysafe.threads, replaysafe.thread_versions")
        c.execute("CREATE TABLE public.scale_meta (actions bigint, open_per_mille int, "
                  "loaded_at timestamptz DEFAULT now())")
        c.execute("INSERT INTO public.scale_meta (actions, open_per_mille) VALUES (%s, %s)",
                  (n, open_per_mille))
    return time.perf_counter() - t0


def prepare(admin: str, label: str, n: int, reuse: bool, open_per_mille: int
            ) -> tuple[str, float | None]:
    """The database of one size, migrated to head and loaded; (owner DSN, load seconds)."""
    import replaysafe_pg

    db = f"scale_{label.lower()}"
    with psycopg.connect(admin, autocommit=True) as c:
        exists = c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone()
        if exists and not reuse:
            c.execute(f"DROP DATABASE {db} WITH (FORCE)")
            exists = None
        if not exists:
            c.execute(f"CREATE DATABASE {db}")
    dsn = pg_conninfo.make_conninfo(admin, dbname=db)
    replaysafe_pg.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        loaded = c.execute("SELECT to_regclass('public.scale_meta') IS NOT NULL").fetchone()
        rows = (c.execute("SELECT actions, open_per_mille FROM public.scale_meta").fetchone()
                if loaded and loaded[0] else None)
        if rows and tuple(rows) != (n, open_per_mille):
            raise SystemExit(f"{db} holds {rows[0]:,} actions ({rows[1]} per mille open), not "
                             f"{n:,} ({open_per_mille}): run without --reuse")
        for role, group in ((WORKER, "replaysafe_worker"), (OPERATOR, "replaysafe_operator"),
                            (AUDITOR, "replaysafe_auditor")):
            c.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN IN ROLE {group}; "
                      "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        for role in (WORKER, OPERATOR):
            c.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => %s)",
                      (role, TENANT))
        c.execute("SELECT replaysafe.bind_role_to_all_tenants(p_role => %s)", (AUDITOR,))
    seconds = None if rows else load(dsn, n, open_per_mille)
    return dsn, seconds


class Target:
    """The worker's and the operator's connections to one database, and its keys."""

    def __init__(self, label: str, dsn: str, run_id: str) -> None:
        self.label = label
        def login(user: str | None = None) -> psycopg.Connection[Any]:
            conninfo = pg_conninfo.make_conninfo(dsn, user=user) if user else dsn
            return psycopg.connect(conninfo, autocommit=True, prepare_threshold=0)

        self.worker, self.operator, self.owner = login(WORKER), login(OPERATOR), login()
        self.auditor = login(AUDITOR)
        # Rows each metrics() call returned (operation -> row count of the last call).
        self.rows: dict[str, int] = {}
        self.run_id = run_id
        self.seq = 0
        # The key, attempt and attempt token of the last new claim (heartbeat and complete use it).
        self.claimed: tuple[str, int, str] | None = None
        self.rng = random.Random(7)
        # A sweep or purge sample's open transaction, rolled back after the timed call.
        self.pending_rollback: psycopg.Connection[Any] | None = None

    def close(self) -> None:
        self.worker.close()
        self.operator.close()
        self.owner.close()
        self.auditor.close()


CLAIM = ("SELECT outcome, attempt, attempt_token FROM replaysafe.claim_action(p_tenant_id => %s, "
         "p_action_key => %s, p_operation => 'refund', p_request => %s::jsonb, p_worker_id => 'scale')")


def operations() -> dict[str, Callable[[Target], Callable[[], Any]]]:
    """Per operation: set-up run untimed, returning the timed call (one round trip)."""

    def claim_new(t: Target) -> Callable[[], Any]:
        t.seq += 1
        key = f"new-{t.run_id}-{t.seq}"

        def call() -> Any:
            row = t.worker.execute(CLAIM, (TENANT, key, '{"order": 1}')).fetchone()
            assert row is not None and row[0] == "claimed"
            t.claimed = (key, row[1], row[2])
            return row
        return call

    def heartbeat(t: Target) -> Callable[[], Any]:
        assert t.claimed
        key, attempt, token = t.claimed
        return lambda: t.worker.execute(
            "SELECT replaysafe.heartbeat_action(p_tenant_id => %s, p_action_key => %s, "
            "p_attempt => %s, p_attempt_token => %s)", (TENANT, key, attempt, token)).fetchone()

    def complete(t: Target) -> Callable[[], Any]:
        assert t.claimed
        key, attempt, token = t.claimed
        return lambda: t.worker.execute(
            "SELECT replaysafe.complete_action(p_tenant_id => %s, p_action_key => %s, "
            "p_attempt => %s, p_attempt_token => %s, p_result => '{\"ok\": true}')",
            (TENANT, key, attempt, token)).fetchone()

    def replay(t: Target) -> Callable[[], Any]:
        i = t.rng.randrange(BENCH_ACTIONS // 100) * 100 + t.rng.randrange(97)  # a succeeded one
        request = f'{{"order": {i}, "amount_cents": 1250, "currency": "EUR"}}'
        return lambda: t.worker.execute(CLAIM, (TENANT, f"k{i:09d}", request)).fetchone()

    def read_thread(t: Target) -> Callable[[], Any]:
        thread = f"th{t.rng.randrange(BENCH_THREADS):08d}"
        return lambda: t.worker.execute(
            "SELECT version FROM replaysafe.read_thread(p_tenant_id => %s, p_thread_id => %s)",
            (TENANT, thread)).fetchone()

    def write_thread(t: Target) -> Callable[[], Any]:
        thread = f"th{t.rng.randrange(BENCH_THREADS):08d}"
        row = t.worker.execute(
            "SELECT version FROM replaysafe.read_thread(p_tenant_id => %s, p_thread_id => %s)",
            (TENANT, thread)).fetchone()
        assert row
        return lambda: t.worker.execute(
            "SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => %s, "
            "p_expected_version => %s, p_state => '{\"step\": 4}')",
            (TENANT, thread, row[0])).fetchone()

    def rolled_back(conn_of: Callable[[Target], psycopg.Connection[Any]], sql: str
                    ) -> Callable[[Target], Callable[[], Any]]:
        def make(t: Target) -> Callable[[], Any]:
            conn = conn_of(t)

            def call() -> Any:
                row = conn.execute(sql).fetchone()
                assert row and row[0] > 0, f"{t.label}: {sql} found nothing to do"
                return row

            conn.execute("BEGIN")
            t.pending_rollback = conn
            return call
        return make

    def audit(sql: str) -> Callable[[Target], Callable[[], Any]]:
        return lambda t: (lambda: t.worker.execute(sql).fetchall())

    def metrics(op: str, conn_of: Callable[[Target], psycopg.Connection[Any]], sql: str
                ) -> Callable[[Target], Callable[[], Any]]:
        def make(t: Target) -> Callable[[], Any]:
            conn = conn_of(t)

            def call() -> Any:
                rows = conn.execute(sql).fetchall()
                assert rows, f"{t.label}: {sql} returned no row"
                t.rows[op] = len(rows)
                return rows
            return call
        return make

    return {
        "claim (new key)": claim_new,
        "heartbeat": heartbeat,
        "complete": complete,
        "replay": replay,
        "read_thread": read_thread,
        "write_thread": write_thread,
        "sweep, tenant (20)": rolled_back(
            lambda t: t.worker, "SELECT replaysafe.sweep_expired_actions(p_limit => 20)"),
        "purge, tenant (100)": rolled_back(
            lambda t: t.operator,
            "SELECT replaysafe.purge_actions(p_older_than => interval '1 day', p_limit => 100)"),
        "sweep, all (20)": rolled_back(
            lambda t: t.owner, "SELECT replaysafe.sweep_expired_actions(p_limit => 20)"),
        "purge, all (100)": rolled_back(
            lambda t: t.owner,
            "SELECT replaysafe.purge_actions(p_older_than => interval '1 day', p_limit => 100)"),
        "unresolved_actions": audit("SELECT * FROM replaysafe.unresolved_actions"),
        "multi_effect_actions": audit("SELECT * FROM replaysafe.multi_effect_actions"),
        "metrics (tenant)": metrics(
            "metrics (tenant)", lambda t: t.worker, "SELECT * FROM replaysafe.metrics()"),
        "metrics, all (by tenant)": metrics(
            "metrics, all (by tenant)", lambda t: t.auditor,
            "SELECT * FROM replaysafe.metrics(p_by_tenant => true)"),
        "metrics, all (totals)": metrics(
            "metrics, all (totals)", lambda t: t.auditor,
            "SELECT * FROM replaysafe.metrics(p_by_tenant => false)"),
    }


def measure(targets: list[Target], samples: int) -> dict[str, dict[str, list[float]]]:
    ops = operations()
    times: dict[str, dict[str, list[float]]] = {op: {t.label: [] for t in targets} for op in ops}
    for _ in range(samples):
        order = targets[:]
        random.shuffle(order)  # no size always goes first
        for op, make in ops.items():
            for t in order:
                call = make(t)
                t0 = time.perf_counter()
                call()
                times[op][t.label].append((time.perf_counter() - t0) * 1e6)
                if t.pending_rollback is not None:
                    t.pending_rollback.execute("ROLLBACK")
                    t.pending_rollback = None
    return times


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def disk_and_memory(admin: str, labels: list[str]) -> list[str]:
    lines = []
    with psycopg.connect(admin, autocommit=True) as c:
        for label in labels:
            size = c.execute("SELECT pg_size_pretty(pg_database_size(%s))",
                             (f"scale_{label.lower()}",)).fetchone()
            assert size
            lines.append(f"  database scale_{label.lower()}: {size[0]}")
        sb = c.execute("SHOW shared_buffers").fetchone()
        assert sb
        lines.append(f"  shared_buffers {sb[0]}")
    try:
        import os

        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        lines.append(f"  machine: {os.cpu_count()} cores, {pages / 2**30:.0f} GiB RAM, "
                     f"{shutil.disk_usage('/tmp').free / 2**30:.0f} GiB free on /tmp")
    except (ValueError, OSError):
        pass
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10k,1M,10M", help="comma-separated, of " + ", ".join(SIZES))
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/replaysafe-scale"))
    ap.add_argument("--reuse", action="store_true",
                    help="keep and reuse the server and its loaded databases in --data-dir")
    ap.add_argument("--keep-server", action="store_true", help="leave the server running")
    ap.add_argument("--open-per-mille", type=int, default=1,
                    help="other tenants' non-terminal actions per thousand (unknown, running, "
                         "retryable in thirds)")
    args = ap.parse_args()
    labels = [s.strip() for s in args.sizes.split(",")]
    unknown = [s for s in labels if s not in SIZES]
    if unknown or "10k" not in labels:
        raise SystemExit(f"--sizes: of {', '.join(SIZES)}, including 10k (the baseline)")

    from replaysafe_pg import embedded

    if not args.reuse and args.data_dir.exists():
        shutil.rmtree(args.data_dir)
    server = embedded.start(args.data_dir / "pgdata", settings=SETTINGS)
    targets: list[Target] = []
    try:
        loads = {}
        for label in labels:
            dsn, seconds = prepare(server.dsn, label, SIZES[label], args.reuse,
                                   args.open_per_mille)
            loads[label] = seconds
            print(f"{label}: " + (f"loaded in {seconds:.0f} s" if seconds is not None else "reused"),
                  file=sys.stderr)
            targets.append(Target(label, dsn, run_id=str(int(time.time()))))
        times = measure(targets, args.samples)
        print(f"\nscale bench: {args.samples} samples per cell, interleaved; µs, client-observed, "
              "as a bound worker login (purge, tenant: a bound operator; sweep/purge, all: the "
              "schema owner; metrics, all: an auditor bound to all tenants); one round trip each")
        head = f"{'operation':24}" + "".join(f"{lab + ' p50':>11}{lab + ' p99':>11}" for lab in labels)
        head += "".join(f"{lab + '/10k':>10}" for lab in labels if lab != "10k")
        print(head)
        worst = (0.0, "")
        for op, per in times.items():
            base = statistics.median(per["10k"])
            row = f"{op:24}" + "".join(f"{statistics.median(per[lab]):11.0f}{p(per[lab], 99):11.0f}"
                                       for lab in labels)
            for lab in labels:
                if lab == "10k":
                    continue
                ratio = statistics.median(per[lab]) / base
                row += f"{ratio:10.2f}"
                if lab == labels[-1] and ratio > worst[0]:
                    worst = (ratio, op)
            print(row)
        for op in ("metrics (tenant)", "metrics, all (by tenant)", "metrics, all (totals)"):
            print(f"  {op} rows returned: " + ", ".join(
                f"{t.label} {t.rows.get(op, 0)}" for t in targets))
        for t in targets:
            open_rows = t.owner.execute(
                "SELECT count(*) FILTER (WHERE state = 'running'), "
                "count(*) FILTER (WHERE state = 'unknown'), "
                "count(*) FILTER (WHERE state = 'retryable') FROM replaysafe.actions "
                "WHERE state IN ('running', 'unknown', 'retryable')").fetchone()
            assert open_rows
            print(f"  {t.label}: non-terminal actions, all tenants: running {open_rows[0]:,}, "
                  f"unknown {open_rows[1]:,}, retryable {open_rows[2]:,}")
        print("\n".join(disk_and_memory(server.dsn, labels)))
        for label, seconds in loads.items():
            if seconds is not None:
                print(f"  load {label}: {seconds:.0f} s")
        print(f"scale: worst p50 ratio {labels[-1]}/10k = {worst[0]:.2f} ({worst[1]})")
        print(f"metrics: p50 ratio {labels[-1]}/10k " + ", ".join(
            f"{op} {statistics.median(times[op][labels[-1]]) / statistics.median(times[op]['10k']):.2f}"
            for op in times if op.startswith("metrics")) + " (target <= 1.2)")
    finally:
        for t in targets:
            t.close()
        if not args.keep_server and not args.reuse:
            embedded.stop(server)
            shutil.rmtree(args.data_dir, ignore_errors=True)
        elif not args.keep_server:
            embedded.stop(server)


if __name__ == "__main__":
    main()
