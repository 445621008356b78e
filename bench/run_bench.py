"""Overhead of ``Ledger.run`` around a no-op tool against calling the SQL functions directly.

Direct (the floor for what ``run`` does): ``claim_action`` then ``complete_action`` as two
prepared statements on one autocommit connection (first call), ``claim_action`` alone
(replay). Ours: ``Ledger.run("noop", noop, {"i": n}, key=...)`` on a fresh key (first call)
and on a completed key (replay).

Counted per call: round trips (every statement the connection sends), commits
(``pg_stat_database.xact_commit``), Python CPU (``time.process_time``, client side).
c=1 runs in this process; c=4 runs four processes, one connection each.

The server is an embedded Postgres with default settings (fsync and synchronous_commit on)
in a fresh data directory under /tmp, stopped by PID at the end.

    PYTHONPATH=. python bench/run_bench.py [--seconds 3] [--rounds 3] [--no-c4]
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, LiteralString

import psycopg

warnings.filterwarnings("ignore", module="platformdirs")

import replaysafe_pg  # noqa: E402
from replaysafe_pg import Ledger, embedded, queries  # noqa: E402

DBOS_ONE_STEP = 163.0  # ops/s, docs/targets.md (c=1)
WRAPPED_SQL_FLOOR = 2700.0  # ops/s, docs/targets.md: claim+complete as plpgsql functions (c=1)


class CountingCursor(psycopg.Cursor[Any]):
    """Counts statements sent: each is one round trip on an autocommit connection. Counted
    at the cursor, which ``Connection.execute`` and the driver's own cursors both use."""

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:  # type: ignore[override]
        CountingConnection.statements += 1
        return super().execute(query, params, **kw)


class CountingConnection(psycopg.Connection[Any]):
    statements = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = CountingCursor


def noop(i: int) -> dict[str, int]:
    return {"i": i}


def direct_params(tenant: str, key: str, i: int) -> dict[str, Any]:
    return {"tenant_id": tenant, "action_key": key, "operation": "noop",
            "request": f'{{"i":{i}}}', "worker_id": "bench", "lease": "30 seconds",
            "thread_id": None, "on_expired": "unknown", "now": None,
            "claim_token": None}


def loop_direct_first(conn: psycopg.Connection[Any], prefix: str, deadline: float) -> int:
    claim: LiteralString = queries.get("claim_action")
    complete: LiteralString = queries.get("complete_action")
    n = 0
    while time.perf_counter() < deadline:
        key = f"{prefix}{n}"
        row = conn.execute(claim, direct_params("bench", key, n), prepare=True).fetchone()
        assert row is not None and row[0] == "claimed"
        conn.execute(complete, {"tenant_id": "bench", "action_key": key, "attempt": row[2],
                                "attempt_token": row[8],  # claim_record's last column
                                "result": f'{{"i":{n}}}', "provider_reference": None,
                                "now": None}, prepare=True).fetchone()
        n += 1
    return n


def loop_direct_replay(conn: psycopg.Connection[Any], prefix: str, deadline: float, keys: int) -> int:
    claim: LiteralString = queries.get("claim_action")
    n = 0
    while time.perf_counter() < deadline:
        i = n % keys
        row = conn.execute(claim, direct_params("bench", f"{prefix}{i}", i), prepare=True).fetchone()
        assert row is not None and row[0] == "replay"
        n += 1
    return n


def loop_run_first(led: Ledger, prefix: str, deadline: float) -> int:
    n = 0
    while time.perf_counter() < deadline:
        ex = led.run("noop", noop, {"i": n}, key=f"{prefix}{n}")
        assert not ex.replay
        n += 1
    return n


def loop_run_replay(led: Ledger, prefix: str, deadline: float, keys: int) -> int:
    n = 0
    while time.perf_counter() < deadline:
        i = n % keys
        ex = led.run("noop", noop, {"i": i}, key=f"{prefix}{i}")
        assert ex.replay
        n += 1
    return n


def commits(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                        ).fetchone()
    assert row is not None
    return int(row[0])


def one_kind(kind: str, dsn: str, seconds: float, tag: str) -> dict[str, float]:
    """Run one workload on one connection; ops/s, round trips, CPU µs per call."""
    conn = CountingConnection.connect(dsn, autocommit=True)
    led = Ledger(conn, tenant_id="bench", worker_id="bench")
    prefix = f"{kind}:{tag}:"
    replay_keys = 500
    if kind.endswith("replay"):  # completed keys to replay
        for i in range(replay_keys):
            led.run("noop", noop, {"i": i}, key=f"{prefix}{i}")
    warm = time.perf_counter() + 0.3
    run_loop(kind, conn, led, prefix if kind.endswith("replay") else prefix + "w:", warm,
             replay_keys)
    # Backends report statistics lazily: flush ours before and after counting commits.
    conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.05)
    c0 = commits(dsn)
    s0 = CountingConnection.statements
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = run_loop(kind, conn, led, prefix, t0 + seconds, replay_keys)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    statements = CountingConnection.statements - s0
    conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.05)
    c1 = commits(dsn)
    led.close()
    conn.close()
    # c1 also counts the reading of c0 and the flush request.
    return {"ops": n / wall, "round_trips": statements / n, "cpu_us": cpu / n * 1e6,
            "commits": (c1 - c0 - 2) / n}


def run_loop(kind: str, conn: psycopg.Connection[Any], led: Ledger, prefix: str, deadline: float,
             keys: int) -> int:
    if kind == "direct_first":
        return loop_direct_first(conn, prefix, deadline)
    if kind == "direct_replay":
        return loop_direct_replay(conn, prefix, deadline, keys)
    if kind == "run_first":
        return loop_run_first(led, prefix, deadline)
    return loop_run_replay(led, prefix, deadline, keys)


def _proc(kind: str, dsn: str, seconds: float, tag: str, barrier: Any, out: Any) -> None:
    warnings.filterwarnings("ignore", module="platformdirs")
    barrier.wait()
    out.put(one_kind(kind, dsn, seconds, tag))


def parallel(kind: str, dsn: str, seconds: float, clients: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(clients)
    out = ctx.Queue()
    tag = uuid.uuid4().hex[:6]
    procs = [ctx.Process(target=_proc, args=(kind, dsn, seconds, f"{tag}{i}", barrier, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds * 10 + 60) for _ in procs]
    for p in procs:
        p.join()
    return sum(r["ops"] for r in results)


KINDS = ("direct_first", "run_first", "direct_replay", "run_replay")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-c4", action="store_true")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-run-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")  # default settings: fsync, synchronous_commit on
    try:
        with psycopg.connect(server.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE run_bench")
            dsn = psycopg.conninfo.make_conninfo(server.dsn, dbname="run_bench")
            settings = dict(c.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                      "('fsync', 'synchronous_commit', 'server_version')").fetchall())
        replaysafe_pg.migrate(dsn)
        print(f"server: {settings}")
        c1: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
        for r in range(args.rounds):
            for kind in KINDS:  # interleaved, so drift hits every kind alike
                c1[kind].append(one_kind(kind, dsn, args.seconds, f"r{r}"))
        med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in c1.items()}
        c4: dict[str, float] = {}
        if not args.no_c4:
            for kind in KINDS:
                c4[kind] = parallel(kind, dsn, args.seconds, 4)
        print()
        print("| workload | c=1 ops/s | c=4 ops/s | round trips/call | commits/call | client CPU µs/call |")
        print("|---|--:|--:|--:|--:|--:|")
        names = {"direct_first": "direct SQL: claim + complete (prepared)",
                 "run_first": "`Ledger.run` no-op, first call",
                 "direct_replay": "direct SQL: claim (replay)",
                 "run_replay": "`Ledger.run` no-op, replay"}
        for kind in KINDS:
            m = med[kind]
            four = f"{c4[kind]:,.0f}" if kind in c4 else "-"
            print(f"| {names[kind]} | {m['ops']:,.0f} | {four} | {m['round_trips']:.2f} | "
                  f"{m['commits']:.2f} | {m['cpu_us']:.0f} |")
        first = med["run_first"]["ops"] / med["direct_first"]["ops"]
        replay = med["run_replay"]["ops"] / med["direct_replay"]["ops"]
        print()
        print(f"run/direct, first call: {first:.2f}x (c=1)"
              + (f", {c4['run_first'] / c4['direct_first']:.2f}x (c=4)" if c4 else ""))
        print(f"run/direct, replay:     {replay:.2f}x (c=1)"
              + (f", {c4['run_replay'] / c4['direct_replay']:.2f}x (c=4)" if c4 else ""))
        target = 10 * DBOS_ONE_STEP / WRAPPED_SQL_FLOOR
        print(f"ESTIMATE ONLY (scaled by the reference numbers of docs/targets.md, not measured): "
              f"10x DBOS one-step >= {target:.2f}x the floor; run() first call here = {first:.2f}x. "
              f"Commit costs differ between machines: measure DBOS itself with bench/peers_bench.py.")
    finally:
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
