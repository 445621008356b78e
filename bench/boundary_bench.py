"""The product against the boundary floor: ``claim_action`` + ``complete_action`` and a replay,
as a bound worker and with a tenant grant, against the same statements behind a bare
SECURITY DEFINER boundary.

    PYTHONPATH=. python bench/boundary_bench.py [--seconds 4] [--rounds 3] [--conns 1,4]
    PYTHONPATH=. python bench/boundary_bench.py --quick      # smoke run: 1 round of 1 s

Targets: the product at ≥ 0.8x the boundary floor at c=1 and c=4, for both operations; the
grant at most 5 % slower than the bound worker. Two operations, each timed as one pgbench
script run (one op), its statements each a transaction of its own:

* ``claim+complete`` — a claim of a new key, then the report of its success (two calls, two
  transactions, like the driver's; the second takes the attempt the first answered, ``\\gset``);
* ``replay`` — a claim of one of 1,000 keys that succeeded already.

Three variants of each, interleaved in rounds on one embedded Postgres (durable defaults,
``pg_stat_statements`` loaded), by pgbench (prepared, no Python in the loop):

* ``floor`` — the floor's statements (``INSERT ... ON CONFLICT DO NOTHING RETURNING`` on a
  table shaped like ``replaysafe.actions``, then an ``UPDATE`` of that row to succeeded; for a
  replay a ``SELECT`` by primary key), each inside a SECURITY DEFINER plpgsql function with
  ``SET search_path = pg_catalog, pg_temp`` and the product's parameters (the report has no
  attempt token), owned by the schema owner, called by the bound worker login: a role with no
  table privilege at all, EXECUTE on those functions only (and replaysafe_worker's), so the
  function boundary is the only way in. What any functions-only design pays at the least;
* ``bound`` — the product, ``replaysafe.claim_action`` and ``replaysafe.complete_action``
  (with the claim's attempt and attempt token), as that same login, bound to the tenant;
* ``grant`` — the product as a second login, unbound, only a member of replaysafe_worker,
  passing ``p_grant => :grant`` (one ``replaysafe.issue_tenant_grant`` of the owner, 1 hour,
  given as ``pgbench -D grant=...``: a bound parameter, pgbench has no ``:'var'``). Measured
  when the installed schema has it (``issue_tenant_grant``, and ``p_grant`` on both
  functions); skipped, and said so, before.

The product's claims go to ``replaysafe.actions``, which so grows up to twice as fast as the floor's
table: a small bias against the product, if any. Per variant: ops/s (medians of the rounds),
the ratios (✓ when the target is met), and the server's execution time per statement
(``pg_stat_statements``, top level: the function call as a whole, without parse, bind and the
commit's flush). It prints that table and writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import psycopg
from _pgbench import (
    CLAIM_SIGNATURE,
    FLOOR_TABLE,
    REPLAY_HEAD,
    REPLAY_KEY,
    REQUEST,
    Sample,
    Variant,
    bench_server,
    describe,
    measure,
    median,
    seed_replays,
    wrapped,
)
from psycopg import conninfo as pg_conninfo

WORKER = "boundary_worker"  # bound to TENANT; the floor's functions and the product
GRANTEE = "boundary_grantee"  # unbound, replaysafe_worker only: the product with a grant
TENANT = "boundary"
ARGS = (f"p_tenant_id => '{TENANT}', p_action_key => KEY, p_operation => 'refund', "
        f"p_request => '{REQUEST}'::jsonb, p_worker_id => 'w1'")
# A new key per call: the run's tag (measure), the client, the client's count of its ops.
NEW_KEY = "'k' || :run || '-' || :client_id || '-' || :n"
GRANT = ", p_grant => :grant"
PRODUCT = "replaysafe.claim_action"
TARGET_FLOOR = 0.80  # product / floor, at least
TARGET_GRANT = 0.95  # grant / bound, at least (at most 5 % slower)

FLOOR_DDL = f"""
CREATE SCHEMA boundary;
{FLOOR_TABLE.format(table="boundary.actions")};
CREATE FUNCTION boundary.claim{CLAIM_SIGNATURE} AS $$
{wrapped("claim", "boundary.actions")} $$;
CREATE FUNCTION boundary.replay{CLAIM_SIGNATURE} AS $$
{wrapped("replay", "boundary.actions")} $$;
CREATE FUNCTION boundary.complete(p_tenant_id text, p_action_key text, p_attempt integer,
    p_result jsonb, p_provider_reference text DEFAULT NULL,
    p_now timestamptz DEFAULT clock_timestamp())
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE boundary.actions x
    SET state = 'succeeded', result = p_result, provider_reference = p_provider_reference,
        completed_at = p_now, updated_at = p_now
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key AND x.attempt = p_attempt
      AND x.state = 'running';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no running attempt % of %', p_attempt, p_action_key;
    END IF;
    RETURN 'succeeded';
END $$;
"""
FLOOR_FUNCTIONS = ("boundary.claim(text, text, text, jsonb, text, interval, text, text, "
                   "timestamptz, text)",
                   "boundary.replay(text, text, text, jsonb, text, interval, text, text, "
                   "timestamptz, text)",
                   "boundary.complete(text, text, integer, jsonb, text, timestamptz)")


def scripts() -> dict[tuple[str, str], str]:
    """The pgbench script of each (operation, variant)."""
    claim, replay = ARGS.replace("KEY", NEW_KEY), ARGS.replace("KEY", REPLAY_KEY)
    token = ", p_attempt_token => :attempt_token"
    out = {}
    # variant, claim and replay function, complete function, its extra arguments, everyone's
    for variant, claims, replays, completes, report, extra in (
            ("floor", "boundary.claim", "boundary.replay", "boundary.complete", "", ""),
            ("bound", PRODUCT, PRODUCT, "replaysafe.complete_action", token, ""),
            ("grant", PRODUCT, PRODUCT, "replaysafe.complete_action", token, GRANT)):
        out[("claim+complete", variant)] = (
            f"\\set n :n + 1\nSELECT * FROM {claims}({claim}{extra}) \\gset\n"
            f"SELECT {completes}(p_tenant_id => '{TENANT}', p_action_key => {NEW_KEY}, "
            f"p_attempt => :attempt{report}, p_result => '{{}}'::jsonb{extra});\n")
        out[("replay", variant)] = f"{REPLAY_HEAD}SELECT * FROM {replays}({replay}{extra});\n"
    return out


def grant_missing(owner: psycopg.Connection[Any]) -> str | None:
    """Why the installed schema has no grant mode, or None when it has."""
    if owner.execute("SELECT 1 FROM pg_proc WHERE proname = 'issue_tenant_grant' "
                     "AND pronamespace = 'replaysafe'::regnamespace").fetchone() is None:
        return "the installed schema has no replaysafe.issue_tenant_grant"
    row = owner.execute(
        "SELECT string_agg(f, ', ') FROM unnest(ARRAY['claim_action', 'complete_action']) f "
        "WHERE NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.proname = f "
        "AND p.pronamespace = 'replaysafe'::regnamespace AND 'p_grant' = ANY(p.proargnames))"
    ).fetchone()
    return f"no p_grant parameter on {row[0]}" if row and row[0] else None


def set_up(dsn: str) -> tuple[str, tuple[str, str] | str]:
    """The roles, the floor, the replay keys: the worker's DSN, and the grantee's DSN and its
    grant or why grant mode is skipped."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        row = owner.execute("SELECT nspowner::regrole::text FROM pg_namespace "
                            "WHERE nspname = 'replaysafe'").fetchone()
        assert row is not None
        schema_owner = row[0]
        owner.execute(f"CREATE ROLE {WORKER} LOGIN IN ROLE replaysafe_worker")
        owner.execute("SELECT replaysafe.bind_role_to_tenant(%s, %s)", (WORKER, TENANT))
        owner.execute(FLOOR_DDL)
        owner.execute(f"ALTER TABLE boundary.actions OWNER TO {schema_owner}")
        owner.execute(f"GRANT USAGE ON SCHEMA boundary TO {WORKER}")
        for function in FLOOR_FUNCTIONS:
            owner.execute(f"ALTER FUNCTION {function} OWNER TO {schema_owner}")
            owner.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
            owner.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {WORKER}")
        held = owner.execute(
            "SELECT string_agg(c.oid::regclass::text, ', ') FROM pg_class c "
            "WHERE c.relnamespace IN ('replaysafe'::regnamespace, 'boundary'::regnamespace) "
            "AND c.relkind IN ('r', 'p') AND has_table_privilege(%s, c.oid, "
            "'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')",
            (WORKER,)).fetchone()
        if held and held[0]:
            raise SystemExit(f"{WORKER} holds table privileges ({held[0]}): not the floor")
        skipped = grant_missing(owner)
        grant = None
        if skipped is None:
            owner.execute(f"CREATE ROLE {GRANTEE} LOGIN IN ROLE replaysafe_worker")
            row = owner.execute("SELECT replaysafe.issue_tenant_grant(p_tenant_id => %s, "
                                "p_ttl => '1 hour')", (TENANT,)).fetchone()
            assert row is not None
            grant = str(row[0])
    worker = pg_conninfo.make_conninfo(dsn, user=WORKER)
    seed_replays(dsn, worker, TENANT, ARGS.replace("KEY", "%s"), "boundary.actions")
    with psycopg.connect(worker, autocommit=True) as conn:  # both replays read a success
        for function in ("boundary.replay", "replaysafe.claim_action"):
            answer = conn.execute(f"SELECT outcome, state::text FROM {function}({ARGS})"
                                  .replace("KEY", "'r0'")).fetchone()
            if answer != ("replay", "succeeded"):
                raise SystemExit(f"{function} answers {answer} for r0, not a replay")
    if grant is None:
        assert skipped is not None
        return worker, skipped
    return worker, (pg_conninfo.make_conninfo(dsn, user=GRANTEE), grant)


def server_us(samples: list[Sample]) -> str:
    """The median server µs of each statement, in the script's order ("claim+complete")."""
    per: dict[bool, list[float]] = {}
    for sample in samples:
        for query, _, us in sample.statements:
            per.setdefault("complete" in query, []).append(us)
    return "+".join(f"{statistics.median(per[k]):.0f}" for k in sorted(per))


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x {'✓' if ratio >= target else '✗'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=4, help="seconds per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--conns", default="1,4", help="connection counts")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1
    conns = [int(c) for c in args.conns.split(",")]

    with bench_server("replaysafe-boundary-") as (dsn, tmp):
        worker, grantee = set_up(dsn)
        variants: dict[str, dict[str, Variant]] = {}
        for (op, variant), text in scripts().items():
            script = tmp / f"{op.replace('+', '_')}-{variant}.sql"
            script.write_text(text)
            if variant != "grant":
                variants.setdefault(op, {})[variant] = Variant(script, worker, {"n": "0"})
            elif not isinstance(grantee, str):
                variants[op][variant] = Variant(script, grantee[0], {"n": "0", "grant": grantee[1]})
        samples = measure(dsn, variants, conns, args.rounds, args.seconds)
        with psycopg.connect(dsn, autocommit=True) as owner:
            left = owner.execute(
                "SELECT (SELECT count(*) FROM replaysafe.actions WHERE state = 'running') "
                "+ (SELECT count(*) FROM boundary.actions WHERE state = 'running')").fetchone()
        if left and left[0]:
            raise SystemExit(f"{left[0]} claims were never completed: the bench is broken")
        header = describe(dsn, args.rounds, args.seconds, "the bound worker / the grantee")

    print(header)
    print(f"# targets: bound/floor ≥ {TARGET_FLOOR:.2f}x, grant/bound ≥ {TARGET_GRANT:.2f}x; "
          "ops/s of whole operations; server µs per statement (claim+complete)")
    if isinstance(grantee, str):
        print(f"# grant mode skipped: {grantee}")
    print("\n| operation | c | floor ops/s | bound ops/s | grant ops/s | bound/floor "
          "| grant/bound | server µs floor | bound | grant |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for op in ("claim+complete", "replay"):
        for c in conns:
            floor, bound = median(samples[(op, "floor", c)]), median(samples[(op, "bound", c)])
            granted = samples.get((op, "grant", c))
            g_ops = f"{median(granted):,.0f}" if granted else "-"
            g_ratio = verdict(median(granted) / bound, TARGET_GRANT) if granted else "-"
            print(f"| {op} | {c} | {floor:,.0f} | {bound:,.0f} | {g_ops} "
                  f"| {verdict(bound / floor, TARGET_FLOOR)} | {g_ratio} "
                  f"| {server_us(samples[(op, 'floor', c)])} "
                  f"| {server_us(samples[(op, 'bound', c)])} "
                  f"| {server_us(granted) if granted else '-'} |")


if __name__ == "__main__":
    main()
