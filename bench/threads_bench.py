"""Thread state throughput: ``write_thread`` (CAS, 2 KB state) and ``read_thread`` against the
bare-SQL floor, measured in the same run on the same server.

Floor for a CAS write: one client transaction on plain tables of the same shape -- UPDATE the
head row's version (the check), INSERT the 2 KB version row, DELETE the pruned version --
which is 5 round trips with BEGIN and COMMIT. Floor for a read: one SELECT of the 2 KB state by
primary key. Ours: one call of the driver (``Threads.write`` / ``Threads.read``), 1 round trip.

Each connection runs in its own process, on its own thread (no CAS conflicts: this measures
cost, not contention). The server is an embedded Postgres with default settings (fsync and
synchronous_commit on) in a fresh data directory under /tmp, stopped by PID at the end.

    PYTHONPATH=. python bench/threads_bench.py [--seconds 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import random
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

import replaysafe_pg
from replaysafe_pg import Threads, embedded

warnings.filterwarnings("ignore", module="platformdirs")

HISTORY_LIMIT = 20
# Incompressible (pglz would shrink a repetitive 2 KB string to almost nothing).
FILLER = base64.b64encode(random.Random(42).randbytes(1425)).decode()

FLOOR_SCHEMA = """
CREATE TABLE bench_head (id text PRIMARY KEY, version bigint NOT NULL);
CREATE TABLE bench_versions (id text, version bigint, state jsonb NOT NULL,
                             PRIMARY KEY (id, version));
"""


def state(n: int) -> dict[str, Any]:
    """About 2 KB of JSON, different per write."""
    return {"step": n, "messages": [{"role": "assistant", "content": f"{n}:{FILLER}"}]}


def floor_write(dsn: str, ident: str, deadline: float, latencies: list[float]) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO bench_head VALUES (%s, 0) ON CONFLICT (id) DO UPDATE SET version = 0",
                     (ident,))
        conn.execute("DELETE FROM bench_versions WHERE id = %s", (ident,))
        conn.commit()
        version = 0
        while (t0 := time.perf_counter()) < deadline:
            with conn.transaction():  # BEGIN ... COMMIT: 2 of the 5 round trips
                row = conn.execute("UPDATE bench_head SET version = version + 1 "
                                   "WHERE id = %s AND version = %s RETURNING version",
                                   (ident, version)).fetchone()
                assert row is not None
                version = row[0]
                conn.execute("INSERT INTO bench_versions VALUES (%s, %s, %s::jsonb)",
                             (ident, version, psycopg.types.json.Jsonb(state(version))))
                conn.execute("DELETE FROM bench_versions WHERE id = %s AND version = %s",
                             (ident, version - HISTORY_LIMIT))
            latencies.append(time.perf_counter() - t0)


def ours_write(dsn: str, ident: str, deadline: float, latencies: list[float]) -> None:
    with Threads(dsn, tenant_id="bench") as th:
        version = th.read(ident).version
        while (t0 := time.perf_counter()) < deadline:
            version = th.write(ident, state(version + 1), version)
            latencies.append(time.perf_counter() - t0)


def floor_read(dsn: str, ident: str, deadline: float, latencies: list[float]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT version FROM bench_head WHERE id = %s", (ident,)).fetchone()
        assert row is not None
        version = row[0]
        while (t0 := time.perf_counter()) < deadline:
            conn.execute("SELECT state FROM bench_versions WHERE id = %s AND version = %s",
                         (ident, version)).fetchone()
            latencies.append(time.perf_counter() - t0)


def ours_read(dsn: str, ident: str, deadline: float, latencies: list[float]) -> None:
    with Threads(dsn, tenant_id="bench") as th:
        while (t0 := time.perf_counter()) < deadline:
            th.read(ident)
            latencies.append(time.perf_counter() - t0)


KINDS = {"floor_write": floor_write, "ours_write": ours_write,
         "floor_read": floor_read, "ours_read": ours_read}


def worker(kind: str, dsn: str, ident: str, seconds: float, barrier: Any,
           out: Any) -> None:
    fn = KINDS[kind]
    warm: list[float] = []
    fn(dsn, ident, time.perf_counter() + 0.3, warm)  # connect, plan caches, first pages
    barrier.wait()
    latencies: list[float] = []
    fn(dsn, ident, time.perf_counter() + seconds, latencies)
    out.put(latencies)


def measure(kind: str, dsn: str, clients: int, seconds: float) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(clients)
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(kind, dsn, f"th{i}", seconds, barrier, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    latencies: list[float] = []
    for _ in procs:
        latencies.extend(out.get(timeout=seconds + 60))
    for p in procs:
        p.join()
    latencies.sort()
    return {"ops": len(latencies) / seconds,
            "p50": latencies[len(latencies) // 2] * 1e3,
            "p99": latencies[int(len(latencies) * 0.99)] * 1e3}


def wal_per_write(dsn: str, kind: str, n: int = 300) -> float:
    """WAL bytes per CAS write: one client, ``n`` writes on a thread of its own."""
    with psycopg.connect(dsn, autocommit=True) as c:
        lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert lsn is not None
        _run_n(kind, dsn, n)
        row = c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn[0],)).fetchone()
        assert row is not None
        return float(row[0]) / n


def _run_n(kind: str, dsn: str, n: int) -> None:
    if kind == "ours_write":
        with Threads(dsn, tenant_id="bench") as th:
            version = th.read("wal").version
            for _ in range(n):
                version = th.write("wal", state(version + 1), version)
        return
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT version FROM bench_head WHERE id = 'wal'").fetchone()
        version = row[0] if row else 0
        if row is None:
            conn.execute("INSERT INTO bench_head VALUES ('wal', 0)")
            conn.commit()
        for _ in range(n):
            with conn.transaction():
                version += 1
                conn.execute("UPDATE bench_head SET version = %s WHERE id = 'wal' AND version = %s",
                             (version, version - 1))
                conn.execute("INSERT INTO bench_versions VALUES ('wal', %s, %s::jsonb)",
                             (version, psycopg.types.json.Jsonb(state(version))))
                conn.execute("DELETE FROM bench_versions WHERE id = 'wal' AND version = %s",
                             (version - HISTORY_LIMIT,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.5, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="rs-threads-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")  # default settings: durability on
    try:
        admin = server.dsn
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("CREATE DATABASE rs_bench")
            settings = c.execute("SELECT current_setting('server_version'), current_setting('fsync'), "
                                 "current_setting('synchronous_commit')").fetchone()
        dsn = pg_conninfo.make_conninfo(admin, dbname="rs_bench")
        replaysafe_pg.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(FLOOR_SCHEMA)
        print(f"Postgres {settings}; {args.rounds} rounds x {args.seconds:g} s per measurement; "
              f"psycopg {psycopg.__version__}")

        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for clients in (1, 4):
                for kind in KINDS:
                    results.setdefault((kind, clients), []).append(
                        measure(kind, dsn, clients, args.seconds))

        def rounds(kind: str, clients: int) -> str:
            return " / ".join(f"{r['ops']:,.0f}" for r in results[(kind, clients)])

        def med(kind: str, clients: int, field: str) -> float:
            return statistics.median(r[field] for r in results[(kind, clients)])

        print("\n| operation | c | ops/s | p50 ms | p99 ms | vs floor | ops/s per round |")
        print("|---|--:|--:|--:|--:|--:|---|")
        for op in ("write", "read"):
            for clients in (1, 4):
                floor_ops = med(f"floor_{op}", clients, "ops")
                for kind in (f"floor_{op}", f"ours_{op}"):
                    ratio = med(kind, clients, "ops") / floor_ops
                    print(f"| {kind} | {clients} | {med(kind, clients, 'ops'):,.0f} | "
                          f"{med(kind, clients, 'p50'):.2f} | {med(kind, clients, 'p99'):.2f} | "
                          f"{ratio:.2f}x | {rounds(kind, clients)} |")
        wal_floor, wal_ours = wal_per_write(dsn, "floor_write"), wal_per_write(dsn, "ours_write")
        print(f"\nWAL per CAS write (1 client, 300 writes): floor {wal_floor:,.0f} B, "
              f"write_thread {wal_ours:,.0f} B ({wal_ours / wal_floor:.2f}x)")
    finally:
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
