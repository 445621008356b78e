"""Purge 1,000,000 terminal actions while a worker keeps claiming new keys.

    PYTHONPATH=. python bench/purge_bench.py [--actions 1000000] [--batch-size 10000]

Own embedded Postgres under /tmp with the default (durable) settings, stopped by PID at the
end. Steps:

1. bulk-load N succeeded actions (one attempt each) finished 30 days ago, with one
   ``INSERT ... SELECT generate_series`` per table as the schema owner, then VACUUM ANALYZE;
2. start a worker process that claims (and completes) new keys in a loop, timing each claim;
3. after a quiet baseline period, run ``replaysafe-pg purge --older-than 7d`` (the real
   command, progress bar on stderr) while the worker keeps going;
4. report the worker's claim latency before vs during the purge (target: p99 during
   <= 3x p99 before) and the purge's duration.

    PYTHONPATH=. python bench/purge_bench.py --threads [100000] [--writers 2]
        [--batch-size 10000] [--baseline-seconds 8]

``--threads``: thread retention instead. The owner inserts N versioned threads (ten tenants,
three kept versions of a small state each) last written 30 days ago, then VACUUM ANALYZE;
``--writers`` processes, each a LOGIN role in ``replaysafe_worker`` bound to the tenant
``live``, write their own fresh threads with ``write_thread`` (one round trip per write,
expected version known, a new thread every 20 writes), timing each write. After the quiet
baseline an operator login bound to every tenant (``bind_role_to_all_tenants``) calls
``purge_threads(p_older_than => '7 days', p_limit => --batch-size)`` (one round trip, its own
transaction, as ``replaysafe-pg purge --threads`` does) until a call returns 0. Reported: the
writers' write latency before vs during the purge (target: p99 during <= 3x p99 before), each
batch's latency and the purge's throughput (threads/s); then that every old thread is a
tombstone and its versions are gone.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", module="platformdirs")

import psycopg  # noqa: E402

import replaysafe_pg  # noqa: E402
from replaysafe_pg import Ledger, embedded  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

LOAD_ACTIONS = """
INSERT INTO replaysafe.actions (tenant_id, action_key, operation, request, state, attempt,
    on_expired, idempotency_key, worker_id, lease_expires_at, result, provider_reference,
    created_at, updated_at, completed_at)
SELECT 't' || (g %% 10), 'order:' || g, 'refund_order',
       jsonb_build_object('order_id', 'o_' || g, 'amount_cents', 100 + g %% 5000),
       'succeeded', 1, 'unknown', replaysafe.idempotency_key('t' || (g %% 10), 'order:' || g),
       'loader', ts + interval '30 seconds',
       jsonb_build_object('refund_id', 're_' || g), 're_' || g, ts, ts + interval '1 second',
       ts + interval '1 second'
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT now() - interval '30 days' + g * interval '1 millisecond') AS t(ts)
"""

LOAD_ATTEMPTS = """
INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at,
    ended_at, outcome, result, provider_reference)
SELECT tenant_id, action_key, 1, 'loader', created_at, completed_at, 'succeeded', result,
       provider_reference
FROM replaysafe.actions
"""


def worker(dsn: str, stop: Any, out: Any) -> None:
    """Claim and complete new keys until told to stop; send (start time, claim seconds)."""
    samples: list[tuple[float, float]] = []
    with Ledger(dsn, tenant_id="live", worker_id="bench-worker") as led:
        i = 0
        while not stop.is_set():
            i += 1
            key = f"live:{os.getpid()}:{i}"
            t0 = time.time()
            c = led.claim(key, "refund_order", {"order_id": key, "amount_cents": 100})
            samples.append((t0, time.time() - t0))
            led.complete(c, {"refund_id": f"re_{i}"})
    out.send(samples)


LOAD_THREADS = """
INSERT INTO replaysafe.threads (tenant_id, thread_id, user_id, version, history_limit,
    oldest_kept, created_at, updated_at)
SELECT 't' || (g %% 10), 'old:' || g, NULL, 3, 20, 1, ts, ts
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT now() - interval '30 days' + g * interval '1 millisecond') AS t(ts)
"""

LOAD_VERSIONS = """
INSERT INTO replaysafe.thread_versions (tenant_id, thread_id, version, state, created_at)
SELECT t.tenant_id, t.thread_id, v,
       jsonb_build_object('step', v, 'messages', jsonb_build_array('hello', 'refund o_42', 'done')),
       t.created_at
FROM replaysafe.threads t, generate_series(1, 3) AS v
"""

WRITER, OPERATOR = "purge_writer", "purge_operator"
WRITE = ("SELECT replaysafe.write_thread(p_tenant_id => 'live', p_thread_id => %s, "
         "p_expected_version => %s, p_state => %s::jsonb)")
PURGE_THREADS = ("SELECT replaysafe.purge_threads(p_older_than => interval '7 days', "
                 "p_limit => %s)")


def thread_writer(dsn: str, stop: Any, out: Any) -> None:
    """Write fresh threads until told to stop; send (start time, write seconds) and the
    statements sent (one per write: one round trip)."""
    samples: list[tuple[float, float]] = []
    sent = 0
    state = '{"step": 1, "messages": ["hello", "refund o_42", "done"]}'
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = version = 0
        thread = ""
        while not stop.is_set():
            if i % 20 == 0:
                thread, version = f"live:{os.getpid()}:{i}", 0
            i += 1
            t0 = time.time()
            row = conn.execute(WRITE, (thread, version, state)).fetchone()
            samples.append((t0, time.time() - t0))
            sent += 1
            assert row is not None and row[0] == version + 1, row
            version = row[0]
    out.send((samples, sent))


def main_threads(args: argparse.Namespace) -> None:
    from psycopg import conninfo as pg_conninfo

    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-purge-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")  # default settings: fsync and synchronous_commit on
    procs: list[Any] = []
    try:
        dsn = server.dsn
        replaysafe_pg.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            for role, group in ((WRITER, "replaysafe_worker"), (OPERATOR, "replaysafe_operator")):
                conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE {group}")
            conn.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => 'live')",
                         (WRITER,))
            conn.execute("SELECT replaysafe.bind_role_to_all_tenants(p_role => %s)", (OPERATOR,))
            t = time.monotonic()
            conn.execute(LOAD_THREADS, {"n": args.threads})
            conn.execute(LOAD_VERSIONS)
            conn.execute("VACUUM (ANALYZE) replaysafe.threads")
            conn.execute("VACUUM (ANALYZE) replaysafe.thread_versions")
            print(f"PostgreSQL {version[0] if version else '?'}; loaded {args.threads:,} threads "
                  f"(3 versions each) last written 30 days ago in {time.monotonic() - t:.1f} s",
                  flush=True)

        stop = mp.Event()
        pipes = []
        for _ in range(args.writers):
            receive, send = mp.Pipe(duplex=False)
            proc = mp.Process(target=thread_writer,
                              args=(pg_conninfo.make_conninfo(dsn, user=WRITER), stop, send))
            proc.start()
            procs.append(proc)
            pipes.append(receive)
        time.sleep(args.baseline_seconds)

        batches: list[tuple[int, float]] = []
        with psycopg.connect(pg_conninfo.make_conninfo(dsn, user=OPERATOR), autocommit=True) as op:
            purge_start = time.time()
            while True:
                t0 = time.perf_counter()
                row = op.execute(PURGE_THREADS, (args.batch_size,)).fetchone()
                batches.append((row[0] if row else 0, time.perf_counter() - t0))
                if not batches[-1][0]:
                    break
            purge_end = time.time()
        time.sleep(1.0)
        stop.set()
        samples: list[tuple[float, float]] = []
        sent = 0
        for receive in pipes:
            got, n = receive.recv()
            samples += got
            sent += n
        for proc in procs:
            proc.join()

        before = [s for t0, s in samples if t0 < purge_start]
        during = [s for t0, s in samples if purge_start <= t0 < purge_end]
        purged = sum(n for n, _ in batches)
        seconds = purge_end - purge_start
        full = [s * 1000 for n, s in batches if n]
        print(f"purge_threads: {purged:,} threads in {seconds:.1f} s ({purged / seconds:,.0f} "
              f"threads/s), {len(full)} batches of up to {args.batch_size:,} + 1 empty, "
              f"one round trip each, as an operator bound to all tenants")
        print(f"batch latency: p50 {statistics.median(full):.0f} ms, min {min(full):.0f} ms, "
              f"max {max(full):.0f} ms; first {full[0]:.0f} ms, last {full[-1]:.0f} ms; "
              f"empty batch {batches[-1][1] * 1000:.0f} ms")
        print(f"writers: {args.writers}, bound worker logins, {sent / len(samples):.2f} round trips "
              "per write")
        print(f"write_thread latency before the purge: {summary(before)}")
        print(f"write_thread latency during the purge: {summary(during)}")
        ratio = pct(during, 0.99) / pct(before, 0.99)
        print(f"p99 during / p99 before: {ratio:.2f}x (target <= 3x)")
        print(f"p50 during / p50 before: {statistics.median(during) / statistics.median(before):.2f}x")
        with psycopg.connect(dsn) as conn:
            left = conn.execute(
                "SELECT count(*) FILTER (WHERE NOT deleted), count(*) FILTER (WHERE deleted) "
                "FROM replaysafe.threads WHERE thread_id LIKE 'old:%'").fetchone()
            versions = conn.execute("SELECT count(*) FROM replaysafe.thread_versions "
                                    "WHERE thread_id LIKE 'old:%'").fetchone()
            live = conn.execute("SELECT count(*) FROM replaysafe.threads WHERE tenant_id = 'live' "
                                "AND NOT deleted").fetchone()
            assert left and versions and live
            print(f"old threads left live: {left[0]}, tombstones: {left[1]:,}, their versions "
                  f"left: {versions[0]}; writers' threads live: {live[0]:,}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"n={len(ms)}, p50 {statistics.median(ms):.2f} ms, p99 {pct(ms, 0.99):.2f} ms, "
            f"max {max(ms):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actions", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--baseline-seconds", type=float, default=8.0)
    parser.add_argument("--threads", type=int, nargs="?", const=100_000, default=None,
                        help="purge this many old threads (default 100000) instead of actions")
    parser.add_argument("--writers", type=int, default=2,
                        help="--threads: processes writing fresh threads meanwhile")
    args = parser.parse_args()
    if args.threads is not None:
        main_threads(args)
        return

    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-purge-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")  # default settings: fsync and synchronous_commit on
    proc: Any = None
    try:
        dsn = server.dsn
        replaysafe_pg.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            t = time.monotonic()
            conn.execute(LOAD_ACTIONS, {"n": args.actions})
            conn.execute(LOAD_ATTEMPTS)
            conn.execute("VACUUM (ANALYZE) replaysafe.actions")
            conn.execute("VACUUM (ANALYZE) replaysafe.action_attempts")
            print(f"PostgreSQL {version[0] if version else '?'}; loaded {args.actions:,} terminal "
                  f"actions + attempts in {time.monotonic() - t:.1f} s", flush=True)

        stop = mp.Event()
        receive, send = mp.Pipe(duplex=False)
        proc = mp.Process(target=worker, args=(dsn, stop, send))
        proc.start()
        time.sleep(args.baseline_seconds)

        env = os.environ | {"PYTHONPATH": str(ROOT)}
        purge_start = time.time()
        done = subprocess.run(
            [sys.executable, "-c", "from replaysafe_pg.cli import main; main()", "--dsn", dsn,
             "purge", "--older-than", "7d", "--batch-size", str(args.batch_size), "--yes"],
            env=env, stdout=subprocess.PIPE, text=True, check=True)
        purge_end = time.time()
        time.sleep(1.0)
        stop.set()
        samples = receive.recv()
        proc.join()

        before = [s for t0, s in samples if t0 < purge_start]
        during = [s for t0, s in samples if purge_start <= t0 < purge_end]
        ratio = pct(during, 0.99) / pct(before, 0.99)
        seconds = purge_end - purge_start
        print(done.stdout.strip())
        print(f"purge: {seconds:.1f} s ({args.actions / seconds:,.0f} actions/s, "
              f"batches of {args.batch_size:,})")
        print(f"claim latency before the purge: {summary(before)}")
        print(f"claim latency during the purge: {summary(during)}")
        print(f"p99 during / p99 before: {ratio:.2f}x (target <= 3x)")
        print(f"p50 during / p50 before: {statistics.median(during) / statistics.median(before):.2f}x")
        with psycopg.connect(dsn) as conn:
            left = conn.execute("SELECT count(*) FROM replaysafe.actions "
                                "WHERE completed_at < now() - interval '7 days'").fetchone()
            print(f"old actions left: {left[0] if left else '?'}")
    finally:
        if proc is not None and proc.is_alive():
            proc.kill()
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
