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
import re
import time
from typing import Any

import psycopg
from _pgbench import (
    CLAIM_SIGNATURE,
    FLOOR_INSERT,
    FLOOR_SELECT,
    FLOOR_TABLE,
    REPLAY_HEAD,
    REPLAY_KEY,
    REQUEST,
    Variant,
    bench_server,
    describe,
    measure,
    median,
    seed_replays,
    wrapped,
)
from psycopg import conninfo as pg_conninfo

WORKER = "anatomy_worker"
TENANT = "anatomy"
ARGS = (f"p_tenant_id => '{TENANT}', p_action_key => KEY, p_operation => 'refund', "
        f"p_request => '{REQUEST}'::jsonb, p_worker_id => 'w1', "
        "p_lease => '30 seconds'::interval, p_thread_id => NULL::text, "
        "p_on_expired => 'unknown', p_claim_token => NULL::text")
NEW_KEY = "'k' || :k || '-' || :client_id || '-{run}'"

FLOOR_DDL = f"""
CREATE SCHEMA bench;
{FLOOR_TABLE.format(table="bench.actions")};
GRANT USAGE ON SCHEMA bench TO {{worker}};
GRANT SELECT, INSERT ON bench.actions TO {{worker}};
CREATE SCHEMA anatomy;
GRANT USAGE ON SCHEMA anatomy TO {{worker}};
"""
WRAPPERS = f"""
CREATE FUNCTION anatomy.wrapper_claim{CLAIM_SIGNATURE} AS $$
{wrapped("claim", "replaysafe.actions")} $$;
CREATE FUNCTION anatomy.wrapper_replay{CLAIM_SIGNATURE} AS $$
{wrapped("replay", "replaysafe.actions")} $$;
"""
# claim_action's tenant check: the inline common case (with or without the grant's test) or,
# in older revisions, the call.
TENANT_CHECK = re.compile(r"IF (?:p_grant IS NOT NULL OR )?pg_collation_for\(p_tenant_id\).*?END IF;|"
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
    head = {"claim": "\\set k random(1, 2000000000)\n", "replay": REPLAY_HEAD}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=4, help="seconds per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--conns", default="1,4", help="connection counts")
    args = parser.parse_args()

    began = time.monotonic()
    with bench_server("replaysafe-anatomy-") as (dsn, tmp):
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute(f"CREATE ROLE {WORKER} LOGIN IN ROLE replaysafe_worker")
            owner.execute("SELECT replaysafe.bind_role_to_tenant(%s, %s)", (WORKER, TENANT))
            owner.execute(FLOOR_DDL.format(worker=WORKER))
            owner.execute(WRAPPERS)
            no_tenant_check(owner)
            owner.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA anatomy TO {WORKER}")
        worker = pg_conninfo.make_conninfo(dsn, user=WORKER)
        seed_replays(dsn, worker, TENANT, ARGS.replace("KEY", "%s"), "bench.actions")
        variants: dict[str, dict[str, Variant]] = {}
        for (op, variant), text in scripts(tmp.name).items():
            script = tmp / f"{op}-{variant.replace(' ', '_')}.sql"
            script.write_text(text)
            variants.setdefault(op, {})[variant] = Variant(script, worker)
        conn_counts = [int(c) for c in args.conns.split(",")]
        samples = measure(dsn, variants, conn_counts, args.rounds, args.seconds)
        print(describe(dsn, args.rounds, args.seconds, "the bound worker") + "\n")
    print("| operation | c | variant | ops/s | ratio to floor | server µs/statement |")
    print("|---|--:|---|--:|--:|--:|")
    for op, named in variants.items():
        for c in conn_counts:
            floor = median(samples[(op, "floor", c)])
            for variant in named:
                ops = median(samples[(op, variant, c)])
                us = median(samples[(op, variant, c)], "exec_us")
                print(f"| {op} | {c} | {variant} | {ops:,.0f} | {ops / floor:.2f}x | {us:.1f} |")
    print(f"\ntotal {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
