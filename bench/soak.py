"""Soak: mixed load on the ledger for ``--minutes`` (default 10) while the database keeps
going away; counts what went wrong and the latency per minute (the table in
docs/guarantees.md, "Faults, measured").

Load, through a TCP proxy (tests/helpers/proxy.py) in front of a Postgres of its own (fsync
and synchronous_commit on, in a temp dir under /tmp, stopped by PID at the end):
``Ledger.run`` from 6 threads and ``AsyncLedger.run`` from 4 tasks on moving windows of keys
(claims, and waits for one another), ``Threads.write`` from 3 writers (read + CAS), a sweep
every 5 s and a purge (of actions finished over 3 minutes ago) every 20 s, as the owner.

Faults: every 30 s a 5 s burst of cuts (every connection, every 0.15-0.35 s); backends
terminated at random every 5-15 s; two crash-restarts (``pg_ctl stop -m immediate``) at a
third and two thirds of the run, 1.5 s and 9 s down. Leases are 30 s.

Counted (tests/helpers/faults.py): tool executions per key, results changed or lost (keys
audited a minute after their first call, before the purge can take them), actions left
``running`` after their lease and a sweep, ``unknown`` actions (every tool returns: none
is needed), callers' errors by class; per minute: calls, how they ended, p50/p99 latency.

    PYTHONPATH=. python bench/soak.py [--minutes 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", module="platformdirs")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from helpers.faults import (  # noqa: E402
    Keys,
    PgServer,
    Tally,
    ThreadTally,
    async_ledger_storm,
    audit_threads,
    compare,
    every,
    ledger_storm,
    percentile,
    terminate_backends,
    threads_storm,
    wait_until_reachable,
)
from helpers.proxy import Proxy  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

LEASE = 30.0
# Think time between a caller's calls: a steady load, not the most the box can take (other
# jobs share it).
PAUSE = (0.02, 0.08)
TENANTS = ("t", "ta")


class Auditor:
    """Audits keys a minute after their first call (before a purge can remove them)."""

    def __init__(self, dsn: str, tallies: dict[str, Tally]) -> None:
        self.dsn = dsn
        self.tallies = tallies
        self.done: set[tuple[str, str]] = set()
        self.changed = self.lost = 0
        self.states: collections.Counter[str] = collections.Counter()  # of the audited keys

    def run(self, min_age: float) -> None:
        now = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as c:
            for tenant, tally in self.tallies.items():
                with tally.lock:
                    due = [k for k, t in tally.first_call.items()
                           if now - t >= min_age and (tenant, k) not in self.done]
                if not due:
                    continue
                rows = c.execute("SELECT action_key, state::text, result FROM replaysafe.actions "
                                 "WHERE tenant_id = %s AND action_key = ANY(%s)",
                                 (tenant, due)).fetchall()
                stored = {k: (s, r) for k, s, r in rows}
                # Still running (a waiter may yet be answered): audit later.
                ready = [k for k in due if stored.get(k, ("", None))[0] != "running"]
                changed, lost = compare(stored, tally, ready)
                self.changed += changed
                self.lost += lost
                # "absent": no claim of the key ever committed (its callers saw errors only).
                self.states.update(stored.get(k, ("absent", None))[0] for k in ready)
                self.done.update((tenant, k) for k in ready)


def minute_lines(events: list[tuple[float, float, str]], t0: float, minutes: int,
                 faults: dict[int, collections.Counter[str]]) -> list[dict[str, Any]]:
    out = []
    for m in range(minutes + 1):
        ev = [e for e in events if t0 + 60 * m <= e[0] < t0 + 60 * (m + 1)]
        if not ev and m == minutes:
            continue
        ends = collections.Counter(e[2] for e in ev)
        lat = [e[1] * 1000 for e in ev if e[2] in ("succeeded", "acked")]
        out.append({"minute": m + 1, "calls": len(ev), "ends": dict(ends),
                    "p50_ms": round(percentile(lat, 50), 1), "p99_ms": round(percentile(lat, 99), 1),
                    "max_ms": round(max(lat, default=float("nan")), 1),
                    "faults": dict(faults.get(m, {}))})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    seconds = args.minutes * 60
    # The retries' warnings would drown the figures; errors (an outcome not recorded) stay.
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s: %(message)s")

    server = PgServer(settings={"fsync": "on", "synchronous_commit": "on"})
    proxy: Proxy | None = None
    try:
        dsn = server.new_database()
        proxy = Proxy(dsn)
        dbname = str(conninfo_to_dict(dsn)["dbname"])
        tallies = {"t": Tally(), "ta": Tally()}
        thread_tally = ThreadTally()
        stop = threading.Event()
        t0 = time.monotonic()
        faults: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)

        def note(what: str, n: int = 1) -> None:
            faults[int((time.monotonic() - t0) // 60)][what] += n

        workers = ledger_storm(proxy.dsn, tallies["t"], stop, workers=6, tenant="t", lease=LEASE,
                               keys=Keys("k", window=10, step_every=4),
                               tool_seconds=(0.005, 0.05), pause=PAUSE)
        workers.append(async_ledger_storm(proxy.dsn, tallies["ta"], stop, tasks=4, tenant="ta",
                                          lease=LEASE, keys=Keys("a", window=8, step_every=4),
                                          pause=PAUSE))
        workers += threads_storm(proxy.dsn, thread_tally, stop, writers=3, threads=4,
                                 thread_prefix=lambda: f"m{int((time.monotonic() - t0) // 60)}-",
                                 pause=PAUSE)
        auditor = Auditor(dsn, tallies)
        owner_errors: collections.Counter[str] = collections.Counter()

        def owner_duty(what: str, query: str) -> None:
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as c:
                    c.execute(query)
                if what == "audit":
                    auditor.run(60)
            except psycopg.OperationalError:
                owner_errors[what] += 1  # the server is down: next time

        def burst() -> None:
            note("cut bursts")
            end = time.monotonic() + 5
            while time.monotonic() < end and not stop.is_set():
                assert proxy is not None
                note("connections cut", proxy.cut())
                time.sleep(random.uniform(0.15, 0.35))

        def terminate() -> None:
            note("backends terminated", terminate_backends(dsn, dbname, 0.3))

        crashes = [(seconds / 3, 1.5), (2 * seconds / 3, 9.0)]
        downs: list[float] = []
        side = threading.Event()
        with every((5, 5), lambda: owner_duty("sweep", "SELECT replaysafe.sweep_expired_actions()"),
                   side), \
                every((20, 20), lambda: owner_duty(
                    "purge", "SELECT replaysafe.purge_actions(p_older_than => '3 minutes')"),
                    side), \
                every((30, 30), lambda: owner_duty("audit", "SELECT 1"), side), \
                every((30, 30), burst, side), every((5, 15), terminate, side):
            for at, down in crashes:
                delay = t0 + at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                note("crash-restarts")
                server.crash()
                crashed = time.monotonic()
                time.sleep(down)
                server.start()
                downs.append(round(time.monotonic() - crashed, 1))
                print(f"[{(time.monotonic() - t0) / 60:.1f} min] crash-restart, "
                      f"{downs[-1]} s down", flush=True)
            rest = t0 + seconds - time.monotonic()
            if rest > 0:
                time.sleep(rest)
            stop.set()
        for t in workers:
            t.join(LEASE * 3)
        elapsed = time.monotonic() - t0

        # The final audit: every lease out, a sweep, every key not audited yet.
        wait_until_reachable(dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            time.sleep(max(0.0, float(c.execute(
                "SELECT coalesce(extract(epoch FROM max(lease_expires_at) - clock_timestamp()), 0) "
                "FROM replaysafe.actions WHERE state = 'running'").fetchone()[0])) + 0.1)  # type: ignore[index]
            running_after_lease = c.execute(
                "SELECT count(*) FROM replaysafe.actions WHERE state = 'running' "
                "AND lease_expires_at <= clock_timestamp()").fetchone()[0]  # type: ignore[index]
            c.execute("SELECT replaysafe.sweep_expired_actions(p_limit => 100000)")
            running_after_sweep = c.execute(
                "SELECT count(*) FROM replaysafe.actions WHERE state = 'running'").fetchone()[0]  # type: ignore[index]
            unknown = c.execute("SELECT count(*) FROM replaysafe.actions WHERE state = 'unknown'"
                                ).fetchone()[0]  # type: ignore[index]
            states = dict(c.execute("SELECT state::text, count(*) FROM replaysafe.actions "
                                    "GROUP BY 1").fetchall())
        auditor.run(0)
        actions = sum(len(t.executions) for t in tallies.values())
        keys_called = sum(len(t.first_call) for t in tallies.values())
        audited = sum(auditor.states.values())
        not_succeeded = audited - auditor.states.get("succeeded", 0)
        events = [e for t in tallies.values() for e in t.events]
        errors = collections.Counter[str]()
        for t in tallies.values():
            errors.update(t.errors)
        threads = audit_threads(dsn, thread_tally)
        summary = {
            "minutes": round(elapsed / 60, 2), "crash_downtimes_s": downs,
            "faults": {k: sum(c[k] for c in faults.values())
                       for k in {k for c in faults.values() for k in c}},
            "run_calls": sum(t.calls for t in tallies.values()), "keys": keys_called,
            "keys_executed": actions,
            "double_runs": sum(1 for t in tallies.values() for r in t.executions.values()
                               if len(r) > 1),
            "changed": auditor.changed, "lost": auditor.lost,
            "running_after_lease": running_after_lease, "running_after_sweep": running_after_sweep,
            "unknown": unknown, "states_at_end_after_purges": states,
            "keys_audited": audited, "audited_states": dict(auditor.states),
            "not_succeeded": not_succeeded,
            "not_succeeded_pct": round(100 * not_succeeded / audited, 3) if audited else None,
            "run_errors": dict(errors), "owner_duties_skipped": dict(owner_errors),
            "threads": threads,
            "per_minute_run": minute_lines(events, t0, int(args.minutes), faults),
            "per_minute_threads": minute_lines(thread_tally.events, t0, int(args.minutes), {}),
        }
        for line in summary["per_minute_run"]:
            print(f"run     min {line['minute']:>2}: {line['calls']:>5} calls, "
                  f"p50 {line['p50_ms']} ms, p99 {line['p99_ms']} ms, max {line['max_ms']} ms, "
                  f"ends {line['ends']}, faults {line['faults']}")
        for line in summary["per_minute_threads"]:
            print(f"threads min {line['minute']:>2}: {line['calls']:>5} writes, "
                  f"p50 {line['p50_ms']} ms, p99 {line['p99_ms']} ms, ends {line['ends']}")
        print(json.dumps({k: v for k, v in summary.items() if not k.startswith("per_minute")},
                         indent=1, default=str))
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1, default=str))
    finally:
        if proxy is not None:
            proxy.close()
        server.close()


if __name__ == "__main__":
    main()
