"""Thread state throughput: ``write_thread`` (CAS, 2 KB state) and ``read_thread`` against the
bare-SQL floor, measured in the same run on the same server.

Floor for a CAS write: one client transaction on plain tables of the same shape -- UPDATE the
head row's version (the check), INSERT the 2 KB version row, DELETE the pruned version --
which is 5 round trips with BEGIN and COMMIT. Floor for a read: one SELECT of the 2 KB state by
primary key. Ours: one call of the driver (``Threads.write`` / ``Threads.read``), 1 round trip.

Each connection runs in its own process, on its own thread (no CAS conflicts: this measures
cost, not contention). Every process alternates floor and ours in short windows on a shared
wall-clock schedule, so both meet the same load from the rest of the machine; the ratio is the
median over the window pairs. The server is an embedded Postgres with default settings (fsync and
synchronous_commit on) in a fresh data directory under /tmp, stopped by PID at the end.

Both sides run as a bound worker login by default (a LOGIN role in ``replaysafe_worker``
bound to the bench tenant, holding plain privileges on the floor's tables): what users run,
through the security path. ``--as-owner`` measures as the schema owner instead.

    PYTHONPATH=. python bench/threads_bench.py [--window 0.5] [--windows 8] [--as-owner]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.types.json import Jsonb

import replaysafe_pg
from replaysafe_pg import Threads, embedded

warnings.filterwarnings("ignore", module="platformdirs")

HISTORY_LIMIT = 20
WORKER_ROLE = "bench_threads_worker"
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


class FloorWrite:
    """One client transaction: UPDATE the version (the check), INSERT the 2 KB version row,
    DELETE the pruned one -- BEGIN + 3 statements + COMMIT = 5 round trips."""

    def __init__(self, dsn: str, ident: str) -> None:
        self.conn = psycopg.connect(dsn)
        self.ident = ident
        self.conn.execute("INSERT INTO bench_head VALUES (%s, 0) ON CONFLICT (id) DO NOTHING",
                          (ident,))
        self.conn.commit()
        row = self.conn.execute("SELECT version FROM bench_head WHERE id = %s", (ident,)).fetchone()
        self.conn.commit()
        assert row is not None
        self.version: int = row[0]

    def __call__(self) -> None:
        with self.conn.transaction():
            row = self.conn.execute("UPDATE bench_head SET version = version + 1 "
                                    "WHERE id = %s AND version = %s RETURNING version",
                                    (self.ident, self.version)).fetchone()
            assert row is not None
            self.version = row[0]
            self.conn.execute("INSERT INTO bench_versions VALUES (%s, %s, %s::jsonb)",
                              (self.ident, self.version, Jsonb(state(self.version))))
            self.conn.execute("DELETE FROM bench_versions WHERE id = %s AND version = %s",
                              (self.ident, self.version - HISTORY_LIMIT))


class OursWrite:
    """``Threads.write``: one call of ``write_thread``, 1 round trip."""

    def __init__(self, dsn: str, ident: str) -> None:
        self.threads = Threads(dsn, tenant_id="bench")
        self.ident = ident
        self.version = self.threads.read(ident).version

    def __call__(self) -> None:
        self.version = self.threads.write(self.ident, state(self.version + 1), self.version)


class FloorRead:
    """The 2 KB state by primary key, 1 round trip."""

    def __init__(self, dsn: str, ident: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.ident = ident
        FloorWrite(dsn, ident)()  # make sure there is a state to read
        row = self.conn.execute("SELECT version FROM bench_head WHERE id = %s", (ident,)).fetchone()
        assert row is not None
        self.version = row[0]

    def __call__(self) -> None:
        self.conn.execute("SELECT state FROM bench_versions WHERE id = %s AND version = %s",
                          (self.ident, self.version)).fetchone()


class OursRead:
    """``Threads.read``: one call of ``read_thread``, 1 round trip."""

    def __init__(self, dsn: str, ident: str) -> None:
        self.threads = Threads(dsn, tenant_id="bench")
        self.ident = ident
        if self.threads.read(ident).version == 0:
            self.threads.write(ident, state(1), 0)

    def __call__(self) -> None:
        self.threads.read(self.ident)


Factory = Callable[[str, str], Callable[[], None]]
PAIRS: dict[str, tuple[Factory, Factory]] = {"write": (FloorWrite, OursWrite),
                                             "read": (FloorRead, OursRead)}


def worker(op: str, dsn: str, ident: str, start: float, window: float, windows: int,
           out: Any) -> None:
    """Alternate floor and ours in windows on a shared wall-clock schedule, so both see the
    same load from the rest of the machine; report ops and latencies per window."""
    floor_cls, ours_cls = PAIRS[op]
    runners: tuple[Callable[[], None], ...] = (floor_cls(dsn, ident), ours_cls(dsn, ident))
    while time.time() < start - 0.5:  # warm up: connections, prepared plans, pages
        for run in runners:
            run()
    counts = [[0] * windows for _ in runners]
    latencies: list[list[float]] = [[], []]
    for k in range(windows):
        order = (0, 1) if k % 2 == 0 else (1, 0)
        for slot, which in enumerate(order):
            end = start + (2 * k + slot + 1) * window
            run, lat = runners[which], latencies[which]
            while (t0 := time.time()) < end:
                run()
                lat.append(time.time() - t0)
                counts[which][k] += 1
    out.put((counts, latencies))


def measure(op: str, dsn: str, clients: int, window: float, windows: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 4.0  # spawn and warm-up happen before the schedule starts
    procs = [ctx.Process(target=worker, args=(op, dsn, f"{op}{clients}_{i}", start, window,
                                              windows, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    per_window = [[0] * windows, [0] * windows]
    lats: list[list[float]] = [[], []]
    for _ in procs:
        counts, latencies = out.get(timeout=4 + 2 * window * windows + 60)
        for which in (0, 1):
            per_window[which] = [a + b for a, b in zip(per_window[which], counts[which],
                                                       strict=True)]
            lats[which].extend(latencies[which])
    for p in procs:
        p.join()
    result: dict[str, Any] = {}
    for which, name in ((0, "floor"), (1, "ours")):
        ls = sorted(lats[which])
        result[name] = {"ops": statistics.median(c / window for c in per_window[which]),
                        "p50": ls[len(ls) // 2] * 1e3, "p99": ls[int(len(ls) * 0.99)] * 1e3}
    result["ratio"] = statistics.median(o / f for f, o in zip(*per_window, strict=True) if f)
    result["ratios"] = [o / f for f, o in zip(*per_window, strict=True) if f]
    return result


def wal_per_write(dsn: str, cls: type[FloorWrite] | type[OursWrite], n: int = 300) -> float:
    """WAL bytes per CAS write: one client, ``n`` writes on a thread of its own."""
    run = cls(dsn, f"wal_{cls.__name__}")
    with psycopg.connect(dsn, autocommit=True) as c:
        lsn = c.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert lsn is not None
        for _ in range(n):
            run()
        row = c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn[0],)).fetchone()
        assert row is not None
        return float(row[0]) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=0.5, help="seconds per window")
    parser.add_argument("--windows", type=int, default=8,
                        help="window pairs (floor, ours) per measurement")
    parser.add_argument("--as-owner", action="store_true",
                        help="connect as the schema owner (skips the security path)")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="rs-threads-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")  # default settings: durability on
    try:
        admin = server.dsn
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("CREATE DATABASE rs_bench")
            settings = c.execute("SELECT current_setting('server_version'), current_setting('fsync'), "
                                 "current_setting('synchronous_commit')").fetchone()
        owner_dsn = pg_conninfo.make_conninfo(admin, dbname="rs_bench")
        replaysafe_pg.migrate(owner_dsn)
        with psycopg.connect(owner_dsn, autocommit=True) as c:
            c.execute(FLOOR_SCHEMA)
            c.execute(f"CREATE ROLE {WORKER_ROLE} LOGIN IN ROLE replaysafe_worker")
            c.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON bench_head, bench_versions "
                      f"TO {WORKER_ROLE}")
            c.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => 'bench')",
                      (WORKER_ROLE,))
        dsn = owner_dsn if args.as_owner else pg_conninfo.make_conninfo(owner_dsn, user=WORKER_ROLE)
        who = "the schema owner" if args.as_owner else f"a bound worker login ({WORKER_ROLE})"
        print(f"Postgres {settings}; {args.windows} alternating window pairs of {args.window:g} s "
              f"per measurement; psycopg {psycopg.__version__}; both sides as {who}")

        print("\n| operation | c | floor ops/s | ours ops/s | ours / floor (median of windows) "
              "| floor p50 / p99 ms | ours p50 / p99 ms | ratio range |")
        print("|---|--:|--:|--:|--:|--:|--:|---|")
        for op in ("write", "read"):
            for clients in (1, 4):
                r = measure(op, dsn, clients, args.window, args.windows)
                f, o = r["floor"], r["ours"]
                print(f"| {op} | {clients} | {f['ops']:,.0f} | {o['ops']:,.0f} | {r['ratio']:.2f}x | "
                      f"{f['p50']:.2f} / {f['p99']:.1f} | {o['p50']:.2f} / {o['p99']:.1f} | "
                      f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f} |", flush=True)
        wal_floor, wal_ours = wal_per_write(dsn, FloorWrite), wal_per_write(dsn, OursWrite)
        print(f"\nWAL per CAS write (1 client, 300 writes): floor {wal_floor:,.0f} B, "
              f"write_thread {wal_ours:,.0f} B ({wal_ours / wal_floor:.2f}x)")
    finally:
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
