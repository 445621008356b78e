"""The head revision against the previous release, in one run on one server.

Two databases of one embedded Postgres (default durability: fsync and synchronous_commit
on): one migrated to the previous revision, one to the head. A LOGIN role bound to the
tenant, member of replaysafe_worker (what users run), calls the SQL functions directly
with prepared statements, the way the driver sends them: claim+complete of a new key, a
replay (a claim of a completed key), and a LangGraph run loop's put (parent: the head).
Windows alternate between the two databases so drift hits both; each prints its ops/s, and
the summary the median ratio head / previous.

    python bench/release_bench.py [--windows 6] [--seconds 2] [--concurrency 1,4] [--ops ...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", module="platformdirs")

import psycopg  # noqa: E402
from psycopg import conninfo  # noqa: E402

import replaysafe_pg  # noqa: E402
from replaysafe_pg import embedded, schema  # noqa: E402

CLAIM = ("SELECT * FROM replaysafe.claim_action(p_tenant_id => %(t)s, p_action_key => %(k)s, "
         "p_operation => 'refund', p_request => %(r)s::jsonb, p_worker_id => 'bench', "
         "p_claim_token => %(c)s)")
COMPLETE_WITH_TOKEN = ("SELECT replaysafe.complete_action(p_tenant_id => %(t)s, p_action_key => %(k)s, "
                       "p_attempt => %(a)s, p_attempt_token => %(tok)s, p_result => %(res)s::jsonb)")
COMPLETE_WITHOUT = ("SELECT replaysafe.complete_action(p_tenant_id => %(t)s, p_action_key => %(k)s, "
                    "p_attempt => %(a)s, p_result => %(res)s::jsonb)")
# A LangGraph run loop: each put's parent is the head the previous put left (the fast path).
PUT = ("SELECT * FROM replaysafe.langgraph_put(p_tenant_id => %(t)s, p_thread_id => %(th)s, "
       "p_checkpoint_ns => '', p_checkpoint_id => %(id)s, p_parent_id => %(parent)s::text, "
       "p_checkpoint => %(cp)s::jsonb, p_metadata => %(md)s::jsonb, "
       "p_channels => ARRAY['messages'], p_versions => ARRAY[%(id)s], p_types => ARRAY['json'], "
       "p_blobs => ARRAY[%(blob)s::bytea])")
CHECKPOINT = '{"v": 4, "ts": "2026-01-01T00:00:00+00:00", "channel_versions": {}, "versions_seen": {}}'
METADATA = '{"source": "loop", "step": 1}'
# The first revision whose reports take the attempt token.
ATTEMPT_TOKENS = "0011"
REQUEST = '{"order": "o_42", "amount": 1299}'
RESULT = '{"refund_id": "re_42", "amount": 1299}'


def _complete(c: psycopg.Connection[Any], key: str, row: Any, tokens: bool) -> None:
    """complete_action for the attempt ``row`` (the claim's answer) holds, with its token
    where the schema takes one."""
    params = {"t": "bench", "k": key, "a": row[2], "res": RESULT}
    if tokens:
        params["tok"] = row[8]
    c.execute(COMPLETE_WITH_TOKEN if tokens else COMPLETE_WITHOUT, params, prepare=True)


def _worker(dsn: str, op: str, seconds: float, tokens: bool, prefix: str, out: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        done = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if op == "claim+complete":
                key = f"{prefix}-{done}"
                row = c.execute(CLAIM, {"t": "bench", "k": key, "r": REQUEST,
                                        "c": secrets.token_hex(16)}, prepare=True).fetchone()
                assert row is not None and row[0] == "claimed", row
                _complete(c, key, row, tokens)
            elif op == "langgraph put":
                checkpoint_id = f"{done:012d}"
                c.execute(PUT, {"t": "bench", "th": prefix, "id": checkpoint_id,
                                "parent": None if done == 0 else f"{done - 1:012d}",
                                "cp": CHECKPOINT, "md": METADATA, "blob": b'{"m": "hello"}'},
                          prepare=True)
            else:
                row = c.execute(CLAIM, {"t": "bench", "k": f"{prefix}-r", "r": REQUEST, "c": None},
                                prepare=True).fetchone()
            done += 1
        out.put(done)


def _setup_replay_key(dsn: str, prefix: str, tokens: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(CLAIM, {"t": "bench", "k": f"{prefix}-r", "r": REQUEST, "c": None}).fetchone()
        assert row is not None
        if row[0] == "claimed":
            _complete(c, f"{prefix}-r", row, tokens)


def window(dsn: str, op: str, concurrency: int, seconds: float, tokens: bool) -> float:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    prefixes = [uuid.uuid4().hex[:12] for _ in range(concurrency)]
    if op == "replay":
        for p in prefixes:
            _setup_replay_key(dsn, p, tokens)
    procs = [ctx.Process(target=_worker, args=(dsn, op, seconds, tokens, p, out)) for p in prefixes]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join(30)
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--ops", default="claim+complete,replay,langgraph put",
                        help="comma-separated: claim+complete, replay, langgraph put")
    args = parser.parse_args()
    head = schema.head_revision()
    previous = schema.revisions()[-2].revision
    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")
    try:
        role = f"bench_{uuid.uuid4().hex[:8]}"
        dsns = {}
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(f'CREATE ROLE "{role}" LOGIN')
            for rev in (previous, head):
                name = f"bench_{rev}"
                admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
                admin.execute(f'CREATE DATABASE "{name}"')
                owner = conninfo.make_conninfo(server.dsn, dbname=name)
                replaysafe_pg.migrate(owner, rev)
                with psycopg.connect(owner, autocommit=True) as c:
                    c.execute(f'GRANT replaysafe_worker TO "{role}"')
                    c.execute("SELECT replaysafe.bind_role_to_tenant(%s, 'bench')", (role,))
                dsns[rev] = conninfo.make_conninfo(server.dsn, dbname=name, user=role)
        print(f"head {head} against {previous}, as a bound worker login; {args.windows} windows "
              f"of {args.seconds:g} s each, alternating")
        for op in args.ops.split(","):
            for concurrency in (int(x) for x in args.concurrency.split(",")):
                ratios = []
                for i in range(args.windows):
                    order = (previous, head) if i % 2 == 0 else (head, previous)
                    rates = {rev: window(dsns[rev], op, concurrency, args.seconds, rev >= ATTEMPT_TOKENS)
                             for rev in order}
                    ratios.append(rates[head] / rates[previous])
                    print(f"  {op:15} c={concurrency} window {i + 1}: {previous} {rates[previous]:8.0f} "
                          f"ops/s, {head} {rates[head]:8.0f} ops/s, ratio {ratios[-1]:.3f}", flush=True)
                print(f"{op:15} c={concurrency}: median ratio {head}/{previous} "
                      f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})",
                      flush=True)
    finally:
        embedded.stop(server)


if __name__ == "__main__":
    sys.exit(main())
