"""The fault suite (docs/guarantees.md, "Faults, measured"): storms through
``Ledger.run``, ``AsyncLedger.run`` and ``Threads.write`` while the database goes away in
every way we know: connections cut by a proxy every 0.15-0.35 s, new ones refused, backends
terminated at random, a low ``statement_timeout``, Postgres crash-stopped
(``pg_ctl stop -m immediate``) and restarted.

Every scenario must show 0 double runs, 0 results changed or lost, 0 actions left
``running``, and no raw psycopg exception reaching a caller of ``run``; under cuts at most
1 % of the actions end anything but ``succeeded``; with Postgres down 1.5 s (and 9 s under
a 30 s lease) all of them succeed. Each test prints its counts (``pytest -s``).
"""

from __future__ import annotations

import random
import threading
import time

import psycopg
from helpers.faults import (
    Keys,
    PgServer,
    Report,
    Tally,
    ThreadTally,
    async_ledger_storm,
    audit,
    audit_threads,
    every,
    ledger_storm,
    terminate_backends,
    threads_storm,
)
from helpers.proxy import Proxy
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def assert_safe(report: Report) -> None:
    assert report.double_runs == 0
    assert report.changed == 0
    assert report.lost == 0
    assert report.running_after_lease == 0
    assert report.running_after_sweep == 0
    assert report.raw_psycopg_errors == 0
    assert report.actions > 0


def test_ledger_run_while_every_connection_is_cut_every_few_hundred_ms(proxy: Proxy,
                                                                       dsn: str) -> None:
    tally, stop = Tally(), threading.Event()
    workers = ledger_storm(proxy.dsn, tally, stop, workers=8, lease=5)
    with every((0.15, 0.35), proxy.cut, threading.Event()):
        time.sleep(6)
    stop.set()
    for t in workers:
        t.join(30)
    report = audit(dsn, "t", tally, 5)
    print("\n" + report.line(f"cuts ({proxy.cuts} connections cut)"))
    assert proxy.cuts > 20
    assert_safe(report)
    assert report.not_succeeded_pct <= 1.0


def test_async_ledger_run_with_backends_terminated_and_a_low_statement_timeout(
        proxy: Proxy, dsn: str) -> None:
    options = conninfo_to_dict(dsn).get("options") or ""
    low = make_conninfo(proxy.dsn, options=f"{options} -c statement_timeout=100".strip())
    dbname = str(conninfo_to_dict(dsn)["dbname"])
    tally, stop = Tally(), threading.Event()
    storm = async_ledger_storm(low, tally, stop, tasks=8, lease=5)
    terminated: list[int] = []
    faults = threading.Event()
    with every((0.2, 0.5), lambda: terminated.append(terminate_backends(dsn, dbname, 0.3)),
               faults), every((0.3, 0.8), proxy.cut, threading.Event()):
        time.sleep(6)
    stop.set()
    storm.join(30)
    report = audit(dsn, "ta", tally, 5)
    print("\n" + report.line(f"async, {sum(terminated)} backends terminated, {proxy.cuts} cut"))
    assert sum(terminated) > 5
    assert_safe(report)
    assert report.not_succeeded_pct <= 1.0


def test_threads_write_while_connections_are_cut(proxy: Proxy, dsn: str) -> None:
    tally, stop = ThreadTally(), threading.Event()
    writers = threads_storm(proxy.dsn, tally, stop, writers=4, threads=3)
    with every((0.15, 0.35), proxy.cut, threading.Event()):
        time.sleep(4)
    stop.set()
    for t in writers:
        t.join(30)
    counts = audit_threads(dsn, tally)
    print(f"\nthreads under cuts: {counts}")
    assert counts["acked"] > 50
    assert counts["lost"] == 0 and counts["doubled"] == 0
    assert counts["raw_psycopg_errors"] == 0  # what Threads raises is DatabaseUnavailable


def crash_storm(server: PgServer, down: float, lease: float, *, before: float = 1.0,
                after: float = 1.5) -> tuple[Report, float]:
    dsn = server.new_database()
    tally, stop = Tally(), threading.Event()
    workers = ledger_storm(dsn, tally, stop, workers=8, lease=lease,
                           keys=Keys(f"c{random.randrange(10**6)}-"))
    time.sleep(before)
    server.crash()
    crashed = time.monotonic()
    time.sleep(down)
    server.start()
    outage = time.monotonic() - crashed
    time.sleep(after)
    stop.set()
    for t in workers:
        t.join(lease * 2)
    return audit(dsn, "t", tally, lease), outage


def test_ledger_run_through_a_crash_restart_of_1_5_s(crash_server: PgServer) -> None:
    report, outage = crash_storm(crash_server, 1.5, 5)
    print("\n" + report.line(f"crash-restart, {outage:.1f} s down"))
    assert_safe(report)
    assert report.not_succeeded == 0
    assert report.errors == {}


def test_ledger_run_through_a_crash_restart_of_9_s_under_a_30_s_lease(
        crash_server: PgServer) -> None:
    report, outage = crash_storm(crash_server, 9, 30, before=0.7, after=1.0)
    print("\n" + report.line(f"crash-restart, {outage:.1f} s down, 30 s lease"))
    assert outage >= 9
    assert_safe(report)
    assert report.not_succeeded == 0
    assert report.errors == {}


def test_the_crash_server_is_not_the_sessions(crash_server: PgServer, dsn: str) -> None:
    with psycopg.connect(crash_server.admin_dsn) as c:
        port = c.execute("SHOW port").fetchone()
    assert port == (str(crash_server.port),)
    assert str(crash_server.port) not in dsn
