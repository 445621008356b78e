"""Action ledger throughput and latency, as ratios against a bare-SQL floor.

    PYTHONPATH=. python bench/ledger_bench.py [--duration 3] [--conns 1,4,16]

Starts its own embedded Postgres under /tmp with default (durable) settings, stops it by PID
at the end. Every cell runs for a fixed time on c connections, each in its own spawned
process (started once and reused). Everything is measured as a bound worker login (a LOGIN
role in ``replaysafe_worker``, bound to the bench tenant): what users run, through the
security path. Four ways to do each operation:

* ``floor`` — bare SQL on a table of the same shape as ``replaysafe.actions`` (same columns,
  keys and indexes), on which the worker holds plain privileges: ``INSERT ... ON CONFLICT DO
  NOTHING RETURNING`` then ``UPDATE ... WHERE pk`` (claim+complete), ``SELECT`` by primary
  key (replay), the INSERT alone (claim-only); prepared statements, autocommit.
* ``0002`` — the same function calls on a second database at revision 0002 (before the trust
  boundary: SECURITY INVOKER functions, row-level security), in the same run.
* ``sql`` — the driver's named queries (``sql/queries.sql``) calling the ledger functions at
  head, prepared, autocommit: what the database costs.
* ``driver`` — the ``Ledger`` methods at head: adds the Python driver's own work.

Then, on one connection, WAL bytes, transaction ids and commits per operation (replays must
assign no transaction id and write no WAL), and the server-side cost of one call of an empty
plpgsql function as SECURITY INVOKER or DEFINER, with or without a pinned search_path.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

warnings.filterwarnings("ignore", module="platformdirs")

OPS = ("claim+complete", "replay", "claim-only")
VARIANTS = ("floor", "0002", "sql", "driver")
TENANT = "bench"
WORKER_ROLE = "bench_worker"
REQUEST = {"order": 42, "amount_cents": 1250, "currency": "EUR"}
RESULT = {"refund_id": "re_3PqX9", "status": "succeeded"}
REPLAY_KEYS = 1000

FLOOR_DDL = """
CREATE SCHEMA bench;
CREATE TABLE bench.actions (LIKE replaysafe.actions INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                            INCLUDING INDEXES);
"""
FLOOR_INSERT = (
    "INSERT INTO bench.actions (tenant_id, action_key, thread_id, operation, request, state, "
    "attempt, on_expired, idempotency_key, worker_id, lease_expires_at, created_at, updated_at) "
    "VALUES (%(tenant_id)s, %(action_key)s, NULL, %(operation)s, %(request)s::jsonb, 'running', "
    "1, 'unknown', %(idem)s, %(worker_id)s, now() + interval '30 seconds', now(), now()) "
    "ON CONFLICT DO NOTHING RETURNING attempt, lease_expires_at")
FLOOR_UPDATE = (
    "UPDATE bench.actions SET state = 'succeeded', result = %(result)s::jsonb, "
    "completed_at = now(), updated_at = now() "
    "WHERE tenant_id = %(tenant_id)s AND action_key = %(action_key)s")
FLOOR_SELECT = (
    "SELECT state, attempt, lease_expires_at, result, error, idempotency_key, provider_reference "
    "FROM bench.actions WHERE tenant_id = %(tenant_id)s AND action_key = %(action_key)s")


def idem(key: str) -> str:
    return "rs1_" + hashlib.sha256(f"{len(TENANT)}:{TENANT}{key}".encode()).hexdigest()


# --- the operations, as one callable per (operation, variant) ---------------------------------

def claim_query(at_0002: bool = False) -> str:
    """The driver's claim; without the claim token (revision 0005) for a 0002 database."""
    from replaysafe_pg import queries

    text = queries.get("claim_action")
    return text.replace(", p_claim_token => %(claim_token)s::text", "") if at_0002 else text


def complete_query(at_0002: bool = False) -> str:
    """The driver's complete; without the attempt token (revision 0011) for a 0002 database."""
    from replaysafe_pg import queries

    text = queries.get("complete_action")
    return text.replace(" p_attempt_token => %(attempt_token)s::text,", "") if at_0002 else text


def make_op(op: str, variant: str, conn: psycopg.Connection[Any], ledger: Any,
            new_key: Callable[[], str], replay_key: Callable[[], str],
            before: psycopg.Connection[Any] | None = None) -> Callable[[], None]:
    request_json, result_json = json.dumps(REQUEST), json.dumps(RESULT)
    worker = ledger.worker_id
    at_0002 = variant == "0002"
    if at_0002:  # the same calls, on the database at revision 0002
        assert before is not None
        conn, variant = before, "sql"

    def claim_params(key: str) -> dict[str, Any]:
        return {"tenant_id": TENANT, "action_key": key, "operation": "refund",
                "request": request_json, "worker_id": worker, "lease": "30 seconds",
                "thread_id": None, "on_expired": "unknown", "now": None, "claim_token": None}

    if variant == "floor":
        def floor_insert(key: str) -> None:
            conn.execute(FLOOR_INSERT, {"tenant_id": TENANT, "action_key": key,
                                        "operation": "refund", "request": request_json,
                                        "idem": idem(key), "worker_id": worker},
                         prepare=True).fetchone()

        if op == "claim+complete":
            def run() -> None:
                key = new_key()
                floor_insert(key)
                conn.execute(FLOOR_UPDATE, {"result": result_json, "tenant_id": TENANT,
                                            "action_key": key}, prepare=True)
        elif op == "claim-only":
            def run() -> None:
                floor_insert(new_key())
        else:
            def run() -> None:
                conn.execute(FLOOR_SELECT, {"tenant_id": TENANT, "action_key": replay_key()},
                             prepare=True).fetchone()
        return run

    if variant == "sql":
        claim_q, complete_q = claim_query(at_0002), complete_query(at_0002)

        if op == "claim+complete":
            def run() -> None:
                key = new_key()
                row = conn.execute(claim_q, claim_params(key), prepare=True).fetchone()
                assert row is not None and row[0] == "claimed"
                conn.execute(complete_q, {"tenant_id": TENANT, "action_key": key,
                                          "attempt": row[2], "result": result_json,
                                          # claim_record's last column (none at 0002)
                                          "attempt_token": None if at_0002 else row[8],
                                          "provider_reference": None, "now": None},
                             prepare=True).fetchone()
        elif op == "claim-only":
            def run() -> None:
                conn.execute(claim_q, claim_params(new_key()), prepare=True).fetchone()
        else:
            def run() -> None:
                row = conn.execute(claim_q, claim_params(replay_key()), prepare=True).fetchone()
                assert row is not None and row[0] == "replay"
        return run

    if op == "claim+complete":
        def run() -> None:
            key = new_key()
            ledger.complete(ledger.claim(key, "refund", REQUEST), RESULT)
    elif op == "claim-only":
        def run() -> None:
            ledger.claim(new_key(), "refund", REQUEST)
    else:
        def run() -> None:
            assert ledger.claim(replay_key(), "refund", REQUEST).outcome == "replay"
    return run


# --- worker processes ----------------------------------------------------------------------------

def worker_main(dsn: str, idx: int, inbox: Any, outbox: Any) -> None:
    warnings.filterwarnings("ignore", module="platformdirs")
    from replaysafe_pg import Ledger

    dsn, before_dsn = dsn.split("|")
    conn = psycopg.connect(dsn, autocommit=True)
    before = psycopg.connect(before_dsn, autocommit=True)
    ledger = Ledger(conn, tenant_id=TENANT, worker_id=f"bench-{idx}")
    outbox.put(("ready", idx))
    replay_cycle = itertools.cycle(f"replay-{i}" for i in range(idx, REPLAY_KEYS, 16))
    seq = itertools.count()

    def new_key() -> str:
        return f"{idx}:{next(seq)}"

    runs: dict[tuple[str, str], Callable[[], None]] = {}
    while (cmd := inbox.get()) is not None:
        op, variant, start_at, end_at = cmd
        run = runs.get((op, variant))
        if run is None:
            run = runs[op, variant] = make_op(op, variant, conn, ledger, new_key,
                                              lambda: next(replay_cycle), before)
            for _ in range(20):  # warm up: plans prepared, caches filled
                run()
        time.sleep(max(0.0, start_at - time.monotonic()))
        latencies: list[float] = []
        while (t0 := time.perf_counter()) < end_at:
            run()
            latencies.append(time.perf_counter() - t0)
        outbox.put(("done", latencies))
    conn.close()
    before.close()


class Workers:
    def __init__(self, dsn: str, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.inboxes = [ctx.Queue() for _ in range(n)]
        self.outbox = ctx.Queue()
        self.procs = [ctx.Process(target=worker_main, args=(dsn, i, self.inboxes[i], self.outbox))
                      for i in range(n)]
        for p in self.procs:
            p.start()
        for _ in range(n):
            assert self.outbox.get(timeout=180)[0] == "ready"

    def slice(self, op: str, variant: str, conns: int, duration: float) -> list[float]:
        # CLOCK_MONOTONIC is system-wide: every worker starts and stops at the same instant.
        start_at = time.monotonic() + 0.15
        end_at = start_at + duration
        for inbox in self.inboxes[:conns]:
            inbox.put((op, variant, start_at, end_at))
        latencies: list[float] = []
        for _ in range(conns):
            kind, lat = self.outbox.get(timeout=duration + 120)
            assert kind == "done"
            latencies += lat
        return latencies

    def cell(self, op: str, conns: int, duration: float,
             slices: int) -> dict[str, tuple[float, float, float]]:
        """Every variant for ``duration`` seconds in total, in alternating slices, so load
        drifting on a shared machine hits all of them alike."""
        latencies: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(slices):
            for v in VARIANTS:
                latencies[v] += self.slice(op, v, conns, duration / slices)
        out = {}
        for v, lat in latencies.items():
            lat.sort()
            p50 = lat[len(lat) // 2] * 1000
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
            out[v] = (len(lat) / duration, p50, p99)
        return out

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for p in self.procs:
            p.join(30)


# --- setup and per-operation costs ------------------------------------------------------------------

def setup(dsn: str, revision: str = "head") -> str | None:
    """Migrates and loads ``dsn``; returns the attempt token of replay-0's attempt (None at
    0002, which has no attempt tokens)."""
    import replaysafe_pg
    from replaysafe_pg import Ledger

    replaysafe_pg.migrate(dsn, revision)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FLOOR_DDL)
        conn.execute(f"GRANT USAGE ON SCHEMA bench TO {WORKER_ROLE}; "
                     f"GRANT SELECT, INSERT, UPDATE ON bench.actions TO {WORKER_ROLE}")
        conn.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => %s)",
                     (WORKER_ROLE, TENANT))
        conn.execute("SET synchronous_commit = off")  # this session only: loading, not measuring
        led = Ledger(conn, tenant_id=TENANT, worker_id="setup")
        keys = iter(f"replay-{i}" for i in range(REPLAY_KEYS)).__next__
        floor = make_op("claim+complete", "floor", conn, led, keys, lambda: "")
        at_0002 = revision == "0002"
        claim_q, complete_q = claim_query(at_0002), complete_query(at_0002)
        first_token: str | None = None
        for i in range(REPLAY_KEYS):
            row = conn.execute(claim_q, {
                "tenant_id": TENANT, "action_key": f"replay-{i}", "operation": "refund",
                "request": json.dumps(REQUEST), "worker_id": "setup", "lease": "30 seconds",
                "thread_id": None, "on_expired": "unknown", "now": None, "claim_token": None,
            }).fetchone()
            assert row is not None
            token = None if at_0002 else row[8]
            first_token = token if i == 0 else first_token
            conn.execute(complete_q, {"tenant_id": TENANT, "action_key": f"replay-{i}",
                                      "attempt": row[2], "attempt_token": token,
                                      "result": json.dumps(RESULT), "provider_reference": None,
                                      "now": None})
            floor()
        conn.execute("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => 'th', "
                     "p_expected_version => 0, p_state => %s::jsonb)", (TENANT, json.dumps(RESULT)))
        conn.execute("VACUUM ANALYZE")
    return first_token


def costs(dsn: str, before_dsn: str, n: int = 200) -> dict[tuple[str, str], dict[str, float]]:
    """WAL bytes, transaction ids and commits per operation, on one connection."""
    from replaysafe_pg import Ledger

    out: dict[tuple[str, str], dict[str, float]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn, \
            psycopg.connect(before_dsn, autocommit=True) as before, \
            psycopg.connect(dsn, autocommit=True) as probe:
        probe.execute("VACUUM")  # no pruning or hint-bit writes left for the reads to do
        led = Ledger(conn, tenant_id=TENANT, worker_id="costs")
        seq = itertools.count()
        replay = itertools.cycle(f"replay-{i}" for i in range(REPLAY_KEYS))
        for op in OPS:
            for variant in VARIANTS:
                if variant == "0002":
                    continue  # another database: the probe below reads this one's counters
                run = make_op(op, variant, conn, led, lambda: f"cost:{next(seq)}",
                              lambda: next(replay), before)
                for _ in range(20):
                    run()

                def sample() -> tuple[int, int, int]:
                    conn.execute("SELECT pg_stat_force_next_flush()")
                    row = probe.execute(
                        "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, "
                        "pg_snapshot_xmax(pg_current_snapshot())::text::bigint, "
                        "(SELECT xact_commit FROM pg_stat_database "
                        " WHERE datname = current_database())").fetchone()
                    assert row is not None
                    return int(row[0]), int(row[1]), int(row[2])

                wal0, xid0, commit0 = sample()
                for _ in range(n):
                    run()
                wal1, xid1, commit1 = sample()
                out[(op, variant)] = {
                    "wal_bytes": (wal1 - wal0) / n,
                    "xids": (xid1 - xid0) / n,
                    # The probe's own reads and the flush calls commit too: a small constant.
                    "commits": (commit1 - commit0 - 2) / n,
                }
    return out


BOUNDARY_FNS = """
CREATE FUNCTION bench.f_invoker(int) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RETURN true; END $$;
CREATE FUNCTION bench.f_definer(int) RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
    AS $$ BEGIN RETURN true; END $$;
CREATE FUNCTION bench.f_invoker_pinned(int) RETURNS boolean LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $$ BEGIN RETURN true; END $$;
CREATE FUNCTION bench.f_definer_pinned(int) RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$ BEGIN RETURN true; END $$;
"""


# One call each, looped inside the server by the worker: what the trust boundary costs per call
# without the round trip and the client (a DO block; its own overhead is the empty loop's).
SERVER_CALLS = ("empty loop", "claim (replay)", "read_thread", "heartbeat (lease lost: RS002)")


def server_calls(attempt_token: str | None) -> dict[str, str]:
    """The statements of SERVER_CALLS. The heartbeat presents replay-0's own attempt token
    (``setup``'s answer; None at 0002, which takes none), so it is refused with RS002 (the
    action is no longer running), not RS004."""
    token = "" if attempt_token is None else f", '{attempt_token}'"
    return {
        "empty loop": "NULL",
        "claim (replay)": "PERFORM replaysafe.claim_action('bench', 'replay-0', 'refund', "
                          f"'{json.dumps(REQUEST)}', 'w')",
        "read_thread": "PERFORM replaysafe.read_thread('bench', 'th')",
        "heartbeat (lease lost: RS002)": "BEGIN PERFORM replaysafe.heartbeat_action("
                                         f"'bench', 'replay-0', 1{token}); "
                                         "EXCEPTION WHEN SQLSTATE 'RS002' THEN NULL; END",
    }


def server_costs(dsn: str, attempt_token: str | None, loops: int = 20_000) -> dict[str, float]:
    """Microseconds per call, in the server, as the worker."""
    out: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, stmt in server_calls(attempt_token).items():
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                conn.execute(f"DO $$ BEGIN FOR i IN 1..{loops} LOOP {stmt}; END LOOP; END $$")
                best = min(best, time.perf_counter() - t0)
            out[name] = best / loops * 1e6
    return out


def boundary_costs(owner_dsn: str, dsn: str, calls: int = 200_000) -> dict[str, float]:
    """Server-side microseconds per call of an empty plpgsql function, called by the worker."""
    with psycopg.connect(owner_dsn, autocommit=True) as owner:
        owner.execute(BOUNDARY_FNS)
        owner.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA bench TO {WORKER_ROLE}")
    out: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(2):  # the second round counts (caches warm)
            for fn in ("f_invoker", "f_definer", "f_invoker_pinned", "f_definer_pinned"):
                row = conn.execute(
                    f"SELECT extract(epoch FROM clock_timestamp() - t0) FROM (SELECT "
                    f"clock_timestamp() AS t0) s, LATERAL (SELECT count(*) FROM "
                    f"generate_series(1, {calls}) g WHERE bench.{fn}(g)) c").fetchone()
                assert row is not None
                out[fn] = float(row[0]) / calls * 1e6
    return out


# --- main ------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=2.5, help="seconds per variant and cell")
    parser.add_argument("--conns", default="1,4,16", help="connection counts")
    parser.add_argument("--slices", type=int, default=3,
                        help="alternating slices per variant and cell")
    args = parser.parse_args()
    conn_counts = [int(c) for c in args.conns.split(",")]

    from replaysafe_pg import embedded

    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")  # default settings: fsync and synchronous_commit on
    workers: Workers | None = None
    try:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            settings: dict[str, str] = dict(admin.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', "
                "'synchronous_commit', 'server_version', 'data_checksums')").fetchall())
            admin.execute("CREATE DATABASE bench")
            admin.execute("CREATE DATABASE bench_0002")
        owner_dsn = pg_conninfo.make_conninfo(server.dsn, dbname="bench")
        owner_before = pg_conninfo.make_conninfo(server.dsn, dbname="bench_0002")
        import replaysafe_pg

        replaysafe_pg.migrate(owner_before, "0002")  # creates the group roles
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {WORKER_ROLE} LOGIN IN ROLE replaysafe_worker")
        setup(owner_before, "0002")
        head_token = setup(owner_dsn)
        dsn = pg_conninfo.make_conninfo(owner_dsn, user=WORKER_ROLE)
        before_dsn = pg_conninfo.make_conninfo(owner_before, user=WORKER_ROLE)
        workers = Workers(f"{dsn}|{before_dsn}", max(conn_counts))
        print(f"# Postgres {settings['server_version']}, fsync={settings['fsync']}, "
              f"synchronous_commit={settings['synchronous_commit']}, "
              f"data_checksums={settings.get('data_checksums')}, {os.cpu_count()} CPUs, "
              f"{args.duration:g} s per variant and cell in {args.slices} alternating slices, "
              f"psycopg {psycopg.__version__}\n")
        print(f"# as the bound worker login {WORKER_ROLE}; 0002 = the same calls on a database at "
              "revision 0002 (before the trust boundary)\n")
        print("| operation | c | floor ops/s | 0002 ops/s (ratio) | sql ops/s (ratio) "
              "| driver ops/s (ratio) | p50 ms floor / 0002 / sql / driver "
              "| p99 ms floor / 0002 / sql / driver |")
        print("|---|--:|--:|--:|--:|--:|--:|--:|")
        for op in OPS:
            for c in conn_counts:
                got = workers.cell(op, c, args.duration, args.slices)
                floor = got["floor"][0]
                print(f"| {op} | {c} | {floor:,.0f} "
                      f"| {got['0002'][0]:,.0f} ({got['0002'][0] / floor:.2f}x) "
                      f"| {got['sql'][0]:,.0f} ({got['sql'][0] / floor:.2f}x) "
                      f"| {got['driver'][0]:,.0f} ({got['driver'][0] / floor:.2f}x) "
                      f"| {' / '.join(f'{got[v][1]:.2f}' for v in VARIANTS)} "
                      f"| {' / '.join(f'{got[v][2]:.2f}' for v in VARIANTS)} |", flush=True)
        workers.close()
        workers = None
        print("\n| operation | variant | WAL bytes/op | xids/op | commits/op |")
        print("|---|---|--:|--:|--:|")
        per_op = costs(dsn, before_dsn)
        for (op, variant), v in per_op.items():
            print(f"| {op} | {variant} | {v['wal_bytes']:,.0f} | {v['xids']:.2f} "
                  f"| {v['commits']:.2f} |")
        replay = per_op[("replay", "sql")]
        ok = replay["xids"] == 0 and replay["wal_bytes"] < 1
        print(f"\nreplay writes nothing: {'yes' if ok else 'NO'} "
              f"(xids/op {replay['xids']:.2f}, WAL bytes/op {replay['wal_bytes']:.1f})")
        print("\n| in the server, µs per call, as the worker (best of 3 loops) | 0002 | head |")
        print("|---|--:|--:|")
        before_us, after_us = server_costs(before_dsn, None), server_costs(dsn, head_token)
        for name in SERVER_CALLS:
            print(f"| {name} | {before_us[name]:.1f} | {after_us[name]:.1f} |")
        fn_costs = boundary_costs(owner_dsn, dsn)
        print("\nserver-side µs per call of an empty plpgsql function (as the worker): "
              + ", ".join(f"{k} {v:.2f}" for k, v in fn_costs.items()))
        print(f"total {time.monotonic() - began:.0f} s")
    finally:
        if workers is not None:
            for p in workers.procs:
                p.kill()
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
