"""The driver's two statement forms on a direct connection, in one run: unnamed
(``prepare=False``, what it sends through a pooler) against prepared statements named by
their content (the default on a connection whose server session is its own).

One embedded Postgres (default durability), one database, a LOGIN role bound to the tenant
and member of replaysafe_worker (what users run). Each window runs the real driver
(``Ledger``) in worker processes with one form, then the other (the order alternates);
``prepare=`` is the switch (False: unnamed; None, the default: prepared after psycopg's five
uses). Operations: ``Ledger.run`` of a new key (claim + complete), a replay (``run`` of a
completed key: one claim), a thread write and a thread read.
With ``--baseline CHECKOUT`` a third form runs that checkout's driver (its defaults), to
compare the driver before and after a change. Prints ops/s per window and the median ratio
of each form to ``prepared``.

    python bench/statement_form_bench.py [--windows 6] [--seconds 2] [--concurrency 1,4]
                                         [--baseline /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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
from replaysafe_pg import embedded  # noqa: E402

OPS = ("run", "replay", "write", "read")


def _refund(order: str) -> dict[str, Any]:
    return {"refund_id": f"re_{order}", "amount": 1299}


def _worker(dsn: str, op: str, form: str, seconds: float, prefix: str) -> int:
    """One process's loop; the count of operations in ``seconds``."""
    options: dict[str, Any] = {} if form == "baseline" else {
        "prepare": None if form == "prepared" else False}
    done = 0
    with replaysafe_pg.Ledger(dsn, tenant_id="bench", worker_id="bench", **options) as ledger, \
            replaysafe_pg.Threads(dsn, tenant_id="bench", **options) as threads:
        replay_key = f"{prefix}-replay"
        ledger.run("refund", _refund, {"order": "o_42"}, key=replay_key)
        version = threads.write(f"{prefix}-t", {"step": 0}, expected_version=0)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if op == "run":
                ledger.run("refund", _refund, {"order": "o_42"}, key=f"{prefix}-{done}")
            elif op == "replay":
                ledger.run("refund", _refund, {"order": "o_42"}, key=replay_key)
            elif op == "write":
                version = threads.write(f"{prefix}-t", {"step": done}, expected_version=version)
            else:
                threads.read(f"{prefix}-t")
            done += 1
    return done


def window(dsn: str, op: str, form: str, concurrency: int, seconds: float,
           baseline: Path | None) -> float:
    """``concurrency`` worker processes at once (``baseline``: importing the driver of that
    checkout instead of this one)."""
    env = dict(os.environ)
    if form == "baseline":
        assert baseline is not None
        env["PYTHONPATH"] = str(baseline)
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", dsn, op, form, str(seconds), uuid.uuid4().hex[:12]],
        stdout=subprocess.PIPE, text=True, env=env, cwd="/") for _ in range(concurrency)]
    total = 0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        assert p.returncode == 0, out
        total += int(out.split()[-1])
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another version: its driver (default prepare) is "
                             "measured too, as 'baseline'")
    args = parser.parse_args()
    forms = ["prepared", "unnamed"] + (["baseline"] if args.baseline else [])
    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-bench-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata")
    try:
        role = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(f'CREATE ROLE "{role}" LOGIN')
            admin.execute("DROP DATABASE IF EXISTS bench_forms")
            admin.execute("CREATE DATABASE bench_forms")
        owner = conninfo.make_conninfo(server.dsn, dbname="bench_forms")
        replaysafe_pg.migrate(owner)
        with psycopg.connect(owner, autocommit=True) as c:
            c.execute(f'GRANT replaysafe_worker TO "{role}"')
            c.execute("SELECT replaysafe.bind_role_to_tenant(%s, 'bench')", (role,))
        dsn = conninfo.make_conninfo(server.dsn, dbname="bench_forms", user=role)
        print(f"the driver as a bound worker login, direct connection; {args.windows} windows "
              f"of {args.seconds:g} s each, the forms alternating")
        for op in args.ops.split(","):
            for concurrency in (int(x) for x in args.concurrency.split(",")):
                ratios: dict[str, list[float]] = {f: [] for f in forms[1:]}
                for i in range(args.windows):
                    order = forms if i % 2 == 0 else forms[::-1]
                    rates = {f: window(dsn, op, f, concurrency, args.seconds, args.baseline)
                             for f in order}
                    for f in forms[1:]:
                        ratios[f].append(rates[f] / rates["prepared"])
                    print(f"  {op:7} c={concurrency} window {i + 1}: " + ", ".join(
                        f"{f} {rates[f]:7.0f} ops/s" for f in forms), flush=True)
                for f, values in ratios.items():
                    print(f"{op:7} c={concurrency}: median ratio {f}/prepared "
                          f"{statistics.median(values):.3f} (range {min(values):.3f}-"
                          f"{max(values):.3f})", flush=True)
    finally:
        embedded.stop(server)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        dsn, op, form, seconds, prefix = sys.argv[2:7]
        print(_worker(dsn, op, form, float(seconds), prefix))
    else:
        sys.exit(main())
