"""One pooled LOGIN serving two tenants through PgBouncer in transaction mode, each agent with
a tenant grant of its own (docs/isolation.md#tenant-grants): a storm of ``Ledger.run`` from
8 processes, and hostile clients of the same login that try to leave a grant or a setting
behind on the server connection they release."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers.pgbouncer import PgBouncer

from replaysafe_pg import issue_grant

ROOT = Path(__file__).resolve().parents[2]
TENANTS = ("acme", "globex")
AGENTS_PER_TENANT = 4
KEYS = 12

AGENT = r"""
import json, os, random, sys
from replaysafe_pg import Ledger

cfg = json.loads(sys.argv[1])
effects = cfg["effects"]

def tool(tenant, key):
    # The side effect: one line appended per run (O_APPEND: lines never interleave).
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps([tenant, key, os.getpid()]) + "\n").encode())
    finally:
        os.close(fd)
    return {"tenant": tenant, "key": key}

keys = [f"k{i}" for i in range(cfg["keys"])]
random.Random(cfg["seed"]).shuffle(keys)
out = []
with Ledger(cfg["dsn"], grant=cfg["grant"], worker_id=cfg["worker"]) as ledger:
    assert ledger.tenant_id == cfg["tenant"]
    for key in keys:
        ex = ledger.run("effect", tool, {"tenant": cfg["tenant"], "key": key}, key=key,
                        lease=5, wait_timeout=60)
        out.append([key, ex.status.value, ex.result])
print(json.dumps(out))
"""


@pytest.fixture
def pooled(dsn: str, admin_dsn: str) -> Iterator[tuple[str, str]]:
    """An unbound pooled LOGIN (a member of replaysafe_worker only) and an issuer LOGIN:
    their direct DSNs."""
    suffix = uuid.uuid4().hex[:8]
    pool, issuer = f"rs_pooled_{suffix}", f"rs_issuer_{suffix}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{pool}" LOGIN IN ROLE replaysafe_worker')
        c.execute(f'CREATE ROLE "{issuer}" LOGIN IN ROLE replaysafe_issuer')
    try:
        yield (psycopg.conninfo.make_conninfo(dsn, user=pool),
               psycopg.conninfo.make_conninfo(dsn, user=issuer))
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'DROP ROLE IF EXISTS "{pool}"')
            c.execute(f'DROP ROLE IF EXISTS "{issuer}"')


def test_a_storm_of_agents_of_two_tenants_on_one_pooled_login(
        dsn: str, transaction_bouncer: PgBouncer, pooled: tuple[str, str],
        tmp_path: Path) -> None:
    pool, issuer = pooled
    through = transaction_bouncer.through(pool)
    effects = tmp_path / "effects"
    agents = []
    for t, tenant in enumerate(TENANTS):
        for a in range(AGENTS_PER_TENANT):
            cfg = {"dsn": through, "grant": issue_grant(issuer, tenant), "tenant": tenant,
                   "worker": f"{tenant}-{a}", "keys": KEYS, "seed": t * 10 + a,
                   "effects": str(effects)}
            agents.append((tenant, subprocess.Popen(
                [sys.executable, "-c", AGENT, json.dumps(cfg)], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})))
    answers: dict[str, list[list[object]]] = {}
    for tenant, proc in agents:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        answers.setdefault(tenant, []).extend(json.loads(out.splitlines()[-1]))

    runs = Counter(tuple(json.loads(line)[:2]) for line in effects.read_text().splitlines())
    expected = {(tenant, f"k{i}") for tenant in TENANTS for i in range(KEYS)}
    assert set(runs) == expected                      # no cross-tenant effect, none missing
    assert max(runs.values()) == 1                    # no double run
    for tenant, rows in answers.items():
        assert len(rows) == AGENTS_PER_TENANT * KEYS
        for key, status, result in rows:
            assert status == "succeeded"
            assert result == {"tenant": tenant, "key": key}   # no wrong outcome
    with psycopg.connect(dsn) as owner:
        by_tenant = dict(owner.execute(
            "SELECT tenant_id, count(*) FILTER (WHERE state = 'succeeded' AND attempt = 1) "
            "FROM replaysafe.actions GROUP BY 1").fetchall())
    assert by_tenant == {tenant: KEYS for tenant in TENANTS}


def _same_server_session(through: str, pid: int, attempts: int = 20) -> psycopg.Connection:
    """A new client connection through the pooler that lands on server session ``pid``."""
    for _ in range(attempts):
        conn = psycopg.connect(through, autocommit=True, prepare_threshold=None)
        row = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()
        if row is not None and row[0] == pid:
            return conn
        conn.close()
    pytest.skip("the pooler did not hand the same server session back")


@pytest.mark.parametrize("leave", [
    "use_grant, then release", "the sealed grant SET at session level",
    "synchronous_commit off at session level", "SET ROLE at session level"])
def test_a_hostile_client_of_the_pooled_login_leaves_the_next_one_nothing(
        dsn: str, transaction_bouncer: PgBouncer, pooled: tuple[str, str], leave: str) -> None:
    pool, issuer = pooled
    through = transaction_bouncer.through(pool)
    grant = issue_grant(issuer, "acme")
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.claim_action(p_tenant_id => 'acme', p_action_key => "
                      "'secret', p_operation => 'op', p_request => '{}', p_worker_id => 'w')")
    with psycopg.connect(through, autocommit=True, prepare_threshold=None) as hostile:
        row = hostile.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()
        assert row is not None
        pid = row[0]
        with hostile.transaction():
            hostile.execute("SELECT replaysafe.use_grant(%s)", (grant,))
            seen = hostile.execute("SELECT count(*) FROM replaysafe.actions_v").fetchone()
            assert seen == (1,)                       # the grant works in its transaction
            sealed = hostile.execute("SELECT current_setting('replaysafe.grant')").fetchone()
        assert sealed is not None
        if leave == "the sealed grant SET at session level":
            hostile.execute("SELECT pg_catalog.set_config('replaysafe.grant', %s, false)",
                            (sealed[0],))
        elif leave == "synchronous_commit off at session level":
            hostile.execute("SET synchronous_commit = off")
        elif leave == "SET ROLE at session level":
            hostile.execute("SET ROLE replaysafe_worker")
    # The next client on that server session.
    with _same_server_session(through, pid) as victim:
        assert victim.execute("SELECT count(*) FROM replaysafe.actions_v").fetchone() == (0,)
        assert victim.execute("SELECT * FROM replaysafe.grant_in_force()").fetchall() == []
        with pytest.raises(psycopg.Error) as denied:
            victim.execute("SELECT replaysafe.read_thread(p_tenant_id => 'acme', "
                           "p_thread_id => 'th')")
        assert denied.value.sqlstate == "RS004"
        # Under a grant of its own, the next client acts for its tenant, and its claim is
        # durable when it commits whatever the server session was left with.
        with victim.transaction():
            token = victim.execute(
                "SELECT (replaysafe.claim_action(p_tenant_id => 'acme', p_action_key => 'next', "
                "p_operation => 'op', p_request => '{}', p_worker_id => 'w', p_grant => %s))"
                ".attempt_token", (grant,)).fetchone()
            assert token is not None and re.fullmatch(r"rsat_\w+", token[0])
            assert victim.execute("SHOW synchronous_commit").fetchone() == ("on",)


def test_the_example_of_docs_isolation_runs(
        dsn: str, transaction_bouncer: PgBouncer, pooled: tuple[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool, issuer = pooled
    monkeypatch.setenv("POOLED_DSN", transaction_bouncer.through(pool))
    monkeypatch.setenv("ISSUER_DSN", issuer)
    text = (ROOT / "docs" / "isolation.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/isolation.md", "exec"), {})


def test_the_pooled_login_without_a_grant_acts_for_nobody(
        transaction_bouncer: PgBouncer, pooled: tuple[str, str]) -> None:
    pool, _ = pooled
    with psycopg.connect(transaction_bouncer.through(pool), autocommit=True,
                         prepare_threshold=None) as conn:
        with pytest.raises(psycopg.Error) as denied:
            conn.execute("SELECT replaysafe.claim_action(p_tenant_id => 'acme', p_action_key => "
                         "'k', p_operation => 'op', p_request => '{}', p_worker_id => 'w')")
        assert denied.value.sqlstate == "RS004"

