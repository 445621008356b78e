"""Our driver against the peers named in docs/targets.md, measured in one run on one server.

    pip install -e '.[bench-peers]'      # langgraph-checkpoint-postgres, dbos, agent-outbox
    PYTHONPATH=. python bench/peers_bench.py [--window 0.4] [--windows 6] [--no-c4]

Comparisons (peer → ours):

* LangGraph ``PostgresSaver.put()`` of a checkpoint carrying ~2 KB of state → ``Threads.write``
  (compare-and-swap on ``expected_version``, 2 KB state, history limit 20);
* LangGraph ``PostgresSaver.get_tuple()`` of the latest of 20 checkpoints → ``Threads.read``;
* LangGraph ``AsyncPostgresSaver`` → ``replaysafe_pg.langgraph.AsyncReplaysafeSaver`` (the
  drop-in, docs/langgraph.md), the same checkpoints: ``aput()`` of a 2 KB checkpoint whose parent
  is the last one (ours also checks that parent is still the newest), ``aget_tuple()`` of the
  latest of 20, ``alist(limit=10)`` of 20; ours as a login in ``replaysafe_worker`` bound to the
  tenant, as deployed;
* DBOS workflow with one no-op step (system database on this server, a database of its own)
  → ``Ledger.run`` around a no-op tool, new key each call;
* agent-outbox ``ToolExecutor.run`` (SQLite, WAL mode, its default settings), first call and
  replay → ``Ledger.run`` first call and replay.

A peer that is not importable is skipped with a note; the rest still runs.

Method (as in threads_bench.py): one embedded Postgres with default settings (fsync and
synchronous_commit on) in a fresh data directory under /tmp, stopped by PID at the end. Each
connection (c) of each side is a spawned process of its own (a peer's background threads must
not compete for our process's GIL, nor ours for its); after setup and warm-up, peer and ours
take turns in short windows on a shared wall-clock schedule (the idle side sleeps), so both meet
the same load from the rest of the machine. ops/s is the median over windows, the ratio the
median of per-window ratios. After the c=1 windows each side alone counts commits
(``pg_stat_database.xact_commit`` summed over all databases), transaction ids and WAL bytes per
operation, and round trips for ours; agent-outbox's SQLite statements and commits are traced.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import itertools
import multiprocessing
import os
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

warnings.filterwarnings("ignore", module="platformdirs")

import replaysafe_pg  # noqa: E402
from replaysafe_pg import Ledger, Threads, embedded  # noqa: E402

HISTORY_LIMIT = 20
LIST_LIMIT = 10
REPLAY_KEYS = 500
# Incompressible, so TOAST compression cannot shrink the 2 KB state to nothing.
FILLER = base64.b64encode(random.Random(42).randbytes(1425)).decode()

PEER_MODULES = {"langgraph": "langgraph.checkpoint.postgres", "dbos": "dbos",
                "agent-outbox": "agent_outbox"}
PEER_DISTS = {"langgraph": "langgraph-checkpoint-postgres", "dbos": "dbos",
              "agent-outbox": "agent-outbox"}


def state(n: int) -> dict[str, Any]:
    """About 2 KB of JSON, different per write (same shape as threads_bench.py)."""
    return {"step": n, "messages": [{"role": "assistant", "content": f"{n}:{FILLER}"}]}


def noop(i: int, w: str = "") -> dict[str, Any]:
    return {"i": i}


class CountingConnection(psycopg.Connection[Any]):
    """Counts statements: each is one round trip on an autocommit connection."""

    statements = 0

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:  # type: ignore[override]
        CountingConnection.statements += 1
        return super().execute(query, params, **kw)


@dataclass
class Env:
    admin_dsn: str  # the server's own database: where the probe counting commits connects
    rs_dsn: str  # replaysafe schema
    lg_dsn: str  # LangGraph's tables
    dbos_url: str  # DBOS system database (SQLAlchemy URL)
    outbox_path: str  # agent-outbox SQLite file
    rs_worker_dsn: str = ""  # replaysafe schema as a LOGIN in replaysafe_worker bound to "bench"


# --- runners: one operation per call; ``conn`` is the connection whose statistics to flush,
# ``None`` when the peer owns its connections (then a pause lets the backend flush itself);
# ``database`` is where its commits are counted --------------------------------------------------

class OursWrite:
    database = "rs_bench"

    def __init__(self, env: Env, ident: str) -> None:
        self.conn = CountingConnection.connect(env.rs_dsn, autocommit=True)
        self.threads = Threads(self.conn, tenant_id="bench")
        self.ident, self.version = ident, 0

    def __call__(self) -> None:
        self.version = self.threads.write(self.ident, state(self.version + 1), self.version,
                                          history_limit=HISTORY_LIMIT)


class OursRead:
    database = "rs_bench"

    def __init__(self, env: Env, ident: str) -> None:
        self.conn = CountingConnection.connect(env.rs_dsn, autocommit=True)
        self.threads = Threads(self.conn, tenant_id="bench")
        self.ident = f"{ident}:r"
        for v in range(HISTORY_LIMIT):
            self.threads.write(self.ident, state(v + 1), v, history_limit=HISTORY_LIMIT)

    def __call__(self) -> None:
        assert self.threads.read(self.ident).state is not None


class OursRunFirst:
    database = "rs_bench"

    def __init__(self, env: Env, ident: str) -> None:
        self.conn = CountingConnection.connect(env.rs_dsn, autocommit=True)
        self.ledger = Ledger(self.conn, tenant_id="bench", worker_id=ident)
        self.ident, self.n = ident, 0

    def __call__(self) -> None:
        self.n += 1
        assert not self.ledger.run("noop", noop, {"i": self.n}, key=f"{self.ident}:{self.n}").replay


class OursRunReplay:
    database = "rs_bench"

    def __init__(self, env: Env, ident: str) -> None:
        self.conn = CountingConnection.connect(env.rs_dsn, autocommit=True)
        self.ledger = Ledger(self.conn, tenant_id="bench", worker_id=ident)
        self.keys = [f"{ident}:replay:{i}" for i in range(REPLAY_KEYS)]
        for i, key in enumerate(self.keys):
            self.ledger.run("noop", noop, {"i": i}, key=key)
        self.cycle = itertools.cycle(enumerate(self.keys))

    def __call__(self) -> None:
        i, key = next(self.cycle)
        assert self.ledger.run("noop", noop, {"i": i}, key=key).replay


class DirectClaimComplete:
    """What ``run`` costs without its Python: the same two SQL functions, called directly as
    prepared statements on an autocommit connection."""

    database = "rs_bench"

    def __init__(self, env: Env, ident: str) -> None:
        from replaysafe_pg import queries

        self.conn = CountingConnection.connect(env.rs_dsn, autocommit=True)
        self.claim, self.complete = queries.get("claim_action"), queries.get("complete_action")
        self.ident, self.n = ident, 0

    def __call__(self) -> None:
        self.n += 1
        key = f"{self.ident}:direct:{self.n}"
        row = self.conn.execute(self.claim, {
            "tenant_id": "bench", "action_key": key, "operation": "noop",
            "request": f'{{"i":{self.n}}}', "worker_id": self.ident, "lease": "30 seconds",
            "thread_id": None, "on_expired": "unknown", "now": None, "claim_token": None},
            prepare=True).fetchone()
        assert row is not None and row[0] == "claimed"
        self.conn.execute(self.complete, {  # the attempt token: claim_record's last column
            "tenant_id": "bench", "action_key": key, "attempt": row[2], "attempt_token": row[8],
            "result": f'{{"i":{self.n}}}', "provider_reference": None, "now": None},
            prepare=True).fetchone()


class LangGraphPut:
    """``put()`` as LangGraph's loop calls it: a new checkpoint whose parent is the last one,
    the 2 KB state as one channel (stored as a blob), metadata with the step."""

    database = "lg_bench"

    def __init__(self, env: Env, ident: str) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        # The connection from_conn_string() opens, kept open without its context manager.
        self.conn = psycopg.connect(env.lg_dsn, autocommit=True, prepare_threshold=0,
                                    row_factory=dict_row)  # type: ignore[arg-type]
        self.saver = PostgresSaver(self.conn)
        self.empty = empty_checkpoint
        self.config: dict[str, Any] = {"configurable": {"thread_id": ident, "checkpoint_ns": ""}}
        self.version: str | None = None
        self.step = 0

    def __call__(self) -> None:
        self.step += 1
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = self.empty()
        checkpoint["channel_values"] = {"messages": state(self.step)["messages"]}
        checkpoint["channel_versions"] = {"messages": self.version}
        self.config = self.saver.put(self.config, checkpoint,  # type: ignore[arg-type]
                                     {"source": "loop", "step": self.step},
                                     {"messages": self.version})


class LangGraphGet:
    database = "lg_bench"

    def __init__(self, env: Env, ident: str) -> None:
        writer = LangGraphPut(env, f"{ident}:r")
        for _ in range(HISTORY_LIMIT):
            writer()
        self.conn, self.saver = writer.conn, writer.saver
        self.config = {"configurable": {"thread_id": f"{ident}:r", "checkpoint_ns": ""}}

    def __call__(self) -> None:
        got = self.saver.get_tuple(self.config)  # type: ignore[arg-type]
        assert got is not None and got.checkpoint["channel_values"]["messages"]


class _Checkpoints:
    """The checkpoints LangGraph's loop puts, as in :class:`LangGraphPut`, for an async saver
    on an event loop of its own (each call runs to completion on it: both sides pay the same
    loop overhead). ``conn`` is None: the saver owns its connection."""

    database = "lg_bench"
    conn = None

    def __init__(self, saver_factory: Callable[[], Any], ident: str) -> None:
        import asyncio

        from langgraph.checkpoint.base import empty_checkpoint

        self.loop = asyncio.new_event_loop()
        self.saver = self.loop.run_until_complete(saver_factory())
        self.empty = empty_checkpoint
        self.ident = ident
        self.config: dict[str, Any] = {"configurable": {"thread_id": ident, "checkpoint_ns": ""}}
        self.version: str | None = None
        self.step = 0

    def put(self) -> None:
        self.step += 1
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = self.empty()
        checkpoint["channel_values"] = {"messages": state(self.step)["messages"]}
        checkpoint["channel_versions"] = {"messages": self.version}
        self.config = self.loop.run_until_complete(self.saver.aput(
            self.config, checkpoint, {"source": "loop", "step": self.step},
            {"messages": self.version}))

    def fill(self) -> None:
        for _ in range(HISTORY_LIMIT):
            self.put()
        self.latest = {"configurable": {"thread_id": self.ident, "checkpoint_ns": ""}}

    def get(self) -> None:
        got = self.loop.run_until_complete(self.saver.aget_tuple(self.latest))
        assert got is not None and got.checkpoint["channel_values"]["messages"]

    def list(self) -> None:
        async def collect() -> int:
            return len([t async for t in self.saver.alist(self.latest, limit=LIST_LIMIT)])

        assert self.loop.run_until_complete(collect()) == LIST_LIMIT


def _peer_saver(env: Env) -> Callable[[], Any]:
    async def make() -> Any:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row

        # The connection AsyncPostgresSaver.from_conn_string() opens, kept open.
        conn = await psycopg.AsyncConnection.connect(
            env.lg_dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        return AsyncPostgresSaver(conn)  # type: ignore[arg-type]
    return make


def _our_saver(env: Env) -> Callable[[], Any]:
    async def make() -> Any:
        from replaysafe_pg.langgraph import AsyncReplaysafeSaver

        # As deployed: a worker login bound to the tenant (no table privileges).
        return AsyncReplaysafeSaver(env.rs_worker_dsn, tenant_id="bench")
    return make


class PeerSaverPut(_Checkpoints):
    def __init__(self, env: Env, ident: str) -> None:
        super().__init__(_peer_saver(env), ident)

    def __call__(self) -> None:
        self.put()


class OurSaverPut(_Checkpoints):
    database = "rs_bench"

    def __init__(self, env: Env, ident: str) -> None:
        super().__init__(_our_saver(env), ident)

    def __call__(self) -> None:
        self.put()


class PeerSaverGet(_Checkpoints):
    def __init__(self, env: Env, ident: str) -> None:
        super().__init__(_peer_saver(env), f"{ident}:r")
        self.fill()

    def __call__(self) -> None:
        self.get()


class OurSaverGet(_Checkpoints):
    database = "rs_bench"

    def __init__(self, env: Env, ident: str) -> None:
        super().__init__(_our_saver(env), f"{ident}:r")
        self.fill()

    def __call__(self) -> None:
        self.get()


class PeerSaverList(PeerSaverGet):
    def __call__(self) -> None:
        self.list()


class OurSaverList(OurSaverGet):
    def __call__(self) -> None:
        self.list()


_dbos_workflow: Callable[[int], int] | None = None


def dbos_workflow(env: Env, ident: str) -> Callable[[int], int]:
    """One DBOS instance per process (DBOS is a process-wide singleton), its own executor id so
    that no process recovers another's workflows at launch."""
    global _dbos_workflow
    if _dbos_workflow is None:
        from dbos import DBOS

        DBOS(config={"name": "peers-bench", "system_database_url": env.dbos_url,
                     "executor_id": f"bench-{ident}-{os.getpid()}", "log_level": "WARNING"})

        @DBOS.step()
        def noop_step(i: int) -> int:
            return i

        @DBOS.workflow()
        def one_step(i: int) -> int:
            return noop_step(i)

        DBOS.launch()
        _dbos_workflow = one_step
    return _dbos_workflow


class DbosOneStep:
    conn = None
    database = "dbos_bench"

    def __init__(self, env: Env, ident: str) -> None:
        self.workflow, self.n = dbos_workflow(env, ident), 0

    def __call__(self) -> None:
        self.n += 1
        assert self.workflow(self.n) == self.n


class OutboxFirst:
    """agent-outbox's documented use: ``ToolExecutor(OutboxStore(path)).run(tool, fn, args,
    session_id)``; the key is a hash of session, tool and args, so new args make a first call."""

    conn = None

    def __init__(self, env: Env, ident: str) -> None:
        from agent_outbox import OutboxStore, ToolExecutor

        self.store = OutboxStore(env.outbox_path)
        self.executor = ToolExecutor(self.store)
        self.ident, self.n = ident, 0

    def __call__(self) -> None:
        self.n += 1
        assert not self.executor.run("noop", noop, {"i": self.n, "w": self.ident}, "bench").replay
        self.executor._tracer.spans.clear()  # its in-memory span list would grow without bound


class OutboxReplay(OutboxFirst):
    def __init__(self, env: Env, ident: str) -> None:
        super().__init__(env, f"{ident}:replay")
        for _ in range(REPLAY_KEYS):
            super().__call__()
        self.cycle = itertools.cycle(range(1, REPLAY_KEYS + 1))

    def __call__(self) -> None:
        args = {"i": next(self.cycle), "w": self.ident}
        assert self.executor.run("noop", noop, args, "bench").replay
        self.executor._tracer.spans.clear()


@dataclass(frozen=True)
class Pair:
    name: str
    peer: str  # key of PEER_MODULES
    peer_label: str
    peer_cls: Callable[[Env, str], Callable[[], None]]
    ours_label: str
    ours_cls: Callable[[Env, str], Callable[[], None]]
    target: float | None  # ours/peer wanted by docs/targets.md
    window_scale: float = 1.0  # longer windows for a slow peer, so each holds enough calls
    floor_label: str | None = None  # a third side: what ours would do without its Python
    floor_cls: Callable[[Env, str], Callable[[], None]] | None = None

    def sides(self) -> list[Callable[[Env, str], Callable[[], None]]]:
        return [self.peer_cls, self.ours_cls] + ([self.floor_cls] if self.floor_cls else [])


PAIRS = (
    Pair("cas-write", "langgraph", "LangGraph `put()` (2 KB)", LangGraphPut,
         "`Threads.write` CAS (2 KB, limit 20)", OursWrite, 1.0),
    Pair("read", "langgraph", "LangGraph `get_tuple()`", LangGraphGet,
         "`Threads.read`", OursRead, 1.5),
    Pair("saver-put", "langgraph", "`AsyncPostgresSaver.aput()` (2 KB)", PeerSaverPut,
         "`AsyncReplaysafeSaver.aput()` (2 KB, with CAS)", OurSaverPut, 1.0),
    Pair("saver-get", "langgraph", "`AsyncPostgresSaver.aget_tuple()`", PeerSaverGet,
         "`AsyncReplaysafeSaver.aget_tuple()`", OurSaverGet, 1.5),
    Pair("saver-list", "langgraph", f"`AsyncPostgresSaver.alist(limit={LIST_LIMIT})`",
         PeerSaverList, f"`AsyncReplaysafeSaver.alist(limit={LIST_LIMIT})`", OurSaverList, None),
    Pair("workflow", "dbos", "DBOS workflow, one no-op step", DbosOneStep,
         "`Ledger.run` no-op, first call", OursRunFirst, 10.0, window_scale=2.5,
         floor_label="claim_action + complete_action called directly",
         floor_cls=DirectClaimComplete),
    Pair("outbox-first", "agent-outbox", "agent-outbox first call", OutboxFirst,
         "`Ledger.run` no-op, first call", OursRunFirst, None),
    Pair("outbox-replay", "agent-outbox", "agent-outbox replay", OutboxReplay,
         "`Ledger.run` no-op, replay", OursRunReplay, None),
)


# --- per-operation costs ------------------------------------------------------------------------

def _sample(probe: psycopg.Connection[Any], database: str) -> tuple[int, int, int]:
    row = probe.execute(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = %s), "
        "pg_snapshot_xmax(pg_current_snapshot())::text::bigint, "
        "pg_current_wal_insert_lsn() - '0/0'::pg_lsn", (database,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _flush(run: Any) -> int:
    """Make the runner's backends publish their statistics; returns operations run for it.

    With the connection in hand, ask for it. Otherwise a backend publishes at the end of its
    first transaction a second or more after its last report: pause, then a few operations
    (a few, in case the peer's pool hands out more than one connection)."""
    if getattr(run, "conn", None) is not None:
        run.conn.execute("SELECT pg_stat_force_next_flush()")
        return 0
    time.sleep(1.1)
    for _ in range(3):
        run()
    return 3


def pg_costs(run: Any, probe: psycopg.Connection[Any], n: int) -> dict[str, float]:
    _flush(run)
    c0, x0, w0 = _sample(probe, run.database)
    s0 = CountingConnection.statements
    for _ in range(n):
        run()
    ops = n + _flush(run)
    statements = CountingConnection.statements - s0
    c1, x1, w1 = _sample(probe, run.database)
    # The probe lives in another database; a flush request on the runner's connection commits.
    overhead = 1 if getattr(run, "conn", None) is not None else 0
    out = {"commits": (c1 - c0 - overhead) / ops, "xids": (x1 - x0) / ops,
           "wal": (w1 - w0) / ops}
    if isinstance(getattr(run, "conn", None), CountingConnection):
        out["round_trips"] = (statements - 1) / n  # minus the flush request
    return out


def sqlite_costs(run: Any, n: int) -> dict[str, float]:
    """agent-outbox: statements and commits its SQLite connection runs, per operation."""
    seen: list[str] = []
    conn: sqlite3.Connection = run.store._conn
    conn.set_trace_callback(seen.append)
    for _ in range(n):
        run()
    conn.set_trace_callback(None)
    commits = sum(1 for s in seen if s.strip().upper().startswith("COMMIT"))
    return {"sqlite_statements": len(seen) / n, "sqlite_commits": commits / n}


# --- worker processes ------------------------------------------------------------------------------

def worker(pair_name: str, side: int, env: Env, ident: str, window: float, windows: int,
           ready: Any, go: Any, start_at: Any, commands: Any, out: Any) -> None:
    """One side (0 peer, 1 ours, 2 floor) of one connection, in a process of its own: a peer's
    background threads (DBOS runs several) must not take the GIL from our calls, nor ours from
    the peer's. Runs in its windows of the shared schedule and sleeps in the others'."""
    warnings.filterwarnings("ignore", module="platformdirs")
    try:
        pair = next(p for p in PAIRS if p.name == pair_name)
        sides = pair.sides()
        run = sides[side](env, ident)
        for _ in range(20):  # warm up: connections, prepared plans, pages, imports
            run()
    except Exception:
        ready.put(("error", traceback.format_exc()))
        return
    ready.put(("ready", ""))
    go.wait()
    start = start_at.value
    while time.time() < start - 0.05:
        run()
    counts = [0] * windows
    latencies: list[float] = []
    n = len(sides)
    for k in range(windows):
        slot = (side + k) % n  # the sides take turns going first
        begin, end = start + (n * k + slot) * window, start + (n * k + slot + 1) * window
        time.sleep(max(0.0, begin - time.time()))
        while (t0 := time.time()) < end:
            run()
            latencies.append(time.time() - t0)
            counts[k] += 1
    out.put(("windows", side, counts, latencies))
    while (command := commands.get()) is not None:
        assert command == "costs"
        if isinstance(run, OutboxFirst):
            cost = sqlite_costs(run, 200)
        else:
            with psycopg.connect(env.admin_dsn, autocommit=True) as probe:
                cost = pg_costs(run, probe, 200)
        out.put(("costs", side, cost))
    if isinstance(run, DbosOneStep):
        from dbos import DBOS

        DBOS.destroy()


def measure(pair: Pair, env: Env, clients: int, window: float, windows: int) -> dict[str, Any]:
    n = len(pair.sides())
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    start_at = ctx.Value("d", 0.0)
    commands = [ctx.Queue() for _ in range(n * clients)]
    procs = [ctx.Process(target=worker, args=(pair.name, i % n, env, f"{pair.name}{clients}_{i // n}",
                                              window, windows, ready, go, start_at,
                                              commands[i], out))
             for i in range(n * clients)]
    for p in procs:
        p.start()
    try:
        errors = [msg for kind, msg in (ready.get(timeout=180) for _ in procs) if kind == "error"]
        if errors:
            raise RuntimeError(errors[0])
        start_at.value = time.time() + 0.3
        go.set()
        per_window = [[0] * windows for _ in range(n)]
        lats: list[list[float]] = [[] for _ in range(n)]
        for _ in procs:
            kind, side, counts, latencies = out.get(timeout=n * window * windows + 120)
            assert kind == "windows"
            per_window[side] = [a + b for a, b in zip(per_window[side], counts, strict=True)]
            lats[side].extend(latencies)
        costs: list[dict[str, float]] = []
        if clients == 1:  # each side alone on the server, one after the other
            for side in range(n):
                commands[side].put("costs")
                kind, got_side, cost = out.get(timeout=120)
                assert kind == "costs" and got_side == side
                costs.append(cost)
        for q in commands:
            q.put(None)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    result: dict[str, Any] = {"costs": costs, "sides": []}
    for side in range(n):
        ls = sorted(lats[side])
        ratios = [o / f for f, o in zip(per_window[0], per_window[side], strict=True) if f]
        result["sides"].append({
            "ops": statistics.median(c / window for c in per_window[side]),
            "p50": ls[len(ls) // 2] * 1e3,
            "ratio": statistics.median(ratios),  # to the peer
            "range": (min(ratios), max(ratios)),
        })
    return result


# --- main --------------------------------------------------------------------------------------------

def available() -> dict[str, str | None]:
    """Peer → version, or None when it cannot be imported."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for peer, module in PEER_MODULES.items():
        try:
            importlib.import_module(module)
            found[peer] = metadata.version(PEER_DISTS[peer])
        except Exception:
            found[peer] = None
    return found


def setup(admin: str, tmp: Path, versions: dict[str, str | None]) -> Env:
    with psycopg.connect(admin, autocommit=True) as c:
        for db in ("rs_bench", "lg_bench", "dbos_bench"):
            c.execute(f"CREATE DATABASE {db}")
    parts = pg_conninfo.conninfo_to_dict(admin)
    env = Env(admin_dsn=admin, rs_dsn=pg_conninfo.make_conninfo(admin, dbname="rs_bench"),
              lg_dsn=pg_conninfo.make_conninfo(admin, dbname="lg_bench"),
              # SQLAlchemy's form of the same Unix-socket server, for DBOS.
              dbos_url=f"postgresql://{parts['user']}@/dbos_bench?host={parts['host']}",
              outbox_path=str(tmp / "outbox.db"))
    replaysafe_pg.migrate(env.rs_dsn)
    with psycopg.connect(env.rs_dsn, autocommit=True) as c:
        c.execute("CREATE ROLE rs_bench_worker LOGIN IN ROLE replaysafe_worker")
        c.execute("SELECT replaysafe.bind_role_to_tenant('rs_bench_worker', 'bench')")
    env.rs_worker_dsn = pg_conninfo.make_conninfo(env.rs_dsn, user="rs_bench_worker")
    if versions["langgraph"]:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(env.lg_dsn) as saver:
            saver.setup()
    return env


def fmt_costs(c: dict[str, float]) -> str:
    if "sqlite_commits" in c:
        return (f"SQLite: {c['sqlite_statements']:.1f} statements, "
                f"{c['sqlite_commits']:.2f} commits | - | -")
    rt = f", {c['round_trips']:.2f} round trips" if "round_trips" in c else ""
    return f"{c['commits']:.2f}{rt} | {c['xids']:.2f} | {c['wal']:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=0.4, help="seconds per window")
    parser.add_argument("--windows", type=int, default=6, help="window pairs per measurement")
    parser.add_argument("--no-c4", action="store_true", help="only one connection")
    parser.add_argument("--only", default="", help="comma-separated comparisons to run")
    args = parser.parse_args()
    began = time.monotonic()

    versions = available()
    for peer, version in versions.items():
        if version is None:
            print(f"SKIP {peer}: `import {PEER_MODULES[peer]}` fails -- "
                  f"pip install -e '.[bench-peers]' to measure it")
    if not any(versions.values()):
        print("no peer to measure against")
        return
    tmp = Path(tempfile.mkdtemp(prefix="rs-peers-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")  # default settings: fsync, synchronous_commit on
    try:
        env = setup(server.dsn, tmp, versions)
        with psycopg.connect(server.dsn, autocommit=True) as c:
            row = c.execute("SELECT current_setting('server_version'), current_setting('fsync'), "
                            "current_setting('synchronous_commit')").fetchone()
        assert row is not None
        with sqlite3.connect(":memory:") as lite:
            sqlite_sync = lite.execute("PRAGMA synchronous").fetchone()[0]
        print(f"Postgres {row[0]} (fsync={row[1]}, synchronous_commit={row[2]}), psycopg "
              f"{psycopg.__version__}, SQLite {sqlite3.sqlite_version} (synchronous={sqlite_sync}), "
              f"{os.cpu_count()} CPUs; peers: "
              + ", ".join(f"{PEER_DISTS[p]} {v}" for p, v in versions.items() if v)
              + f"; {args.windows} window pairs of {args.window:g} s per line")
        print("\n| peer | ours | c | peer ops/s | ours ops/s | ours / peer | ratio range "
              "| peer / ours p50 ms | target |")
        print("|---|---|--:|--:|--:|--:|---|--:|---|")
        costs: dict[str, list[dict[str, float]]] = {}
        floors: list[str] = []
        only = set(filter(None, args.only.split(",")))
        for pair in PAIRS:
            if versions[pair.peer] is None or (only and pair.name not in only):
                continue
            for clients in (1,) if args.no_c4 else (1, 4):
                try:
                    r = measure(pair, env, clients, args.window * pair.window_scale, args.windows)
                except Exception as exc:  # a peer that cannot run here must not stop the rest
                    print(f"| {pair.peer_label} | {pair.ours_label} | {clients} | failed: "
                          f"{str(exc).strip().splitlines()[-1]} | | | | | |", flush=True)
                    break
                if r["costs"]:
                    costs[pair.name] = r["costs"]
                peer, ours = r["sides"][:2]
                target = "" if pair.target is None else (
                    f">= {pair.target:g}x: {'met' if ours['ratio'] >= pair.target else 'NOT met'}")
                print(f"| {pair.peer_label} | {pair.ours_label} | {clients} "
                      f"| {peer['ops']:,.0f} | {ours['ops']:,.0f} | **{ours['ratio']:.2f}x** "
                      f"| {ours['range'][0]:.2f}-{ours['range'][1]:.2f} "
                      f"| {peer['p50']:.2f} / {ours['p50']:.2f} | {target} |", flush=True)
                if pair.floor_label:
                    floor = r["sides"][2]
                    floors.append(f"| {pair.floor_label} | {pair.peer_label} | {clients} "
                                  f"| {floor['ops']:,.0f} | **{floor['ratio']:.2f}x** "
                                  f"| {floor['range'][0]:.2f}-{floor['range'][1]:.2f} "
                                  f"| {ours['ops'] / floor['ops']:.2f}x |")
        if floors:
            print("\nThird side in the same windows (ours without its Python):\n")
            print("| floor | peer | c | floor ops/s | floor / peer | ratio range | ours / floor |")
            print("|---|---|--:|--:|--:|---|--:|")
            print("\n".join(floors))
        print("\nPer operation (each side alone, 200 operations after the c=1 windows):\n")
        print("| operation | commits/op | xids/op | WAL bytes/op |")
        print("|---|--:|--:|--:|")
        for pair in PAIRS:
            labels = [pair.peer_label, pair.ours_label, pair.floor_label]
            for label, cost in zip(labels, costs.get(pair.name, []), strict=False):
                print(f"| {label} | {fmt_costs(cost)} |")
        print(f"\ntotal {time.monotonic() - began:.0f} s")
    finally:
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
