"""Tenant grants from the driver (SPEC §4 "Pooled logins and tenant grants", §6): one pooled
login bound to no tenant acts for each tenant with the grant an issuer signed for it.

The logins are real LOGIN roles: a pooled worker (a member of replaysafe_worker only, bound
to nothing), a pooled worker that is an operator too, and an issuer (replaysafe_issuer)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers.cli import assert_one_line_error, run
from helpers.db import own_connection
from psycopg import conninfo as pg_conninfo

import replaysafe_pg
from replaysafe_pg import (
    AccessDenied,
    ActionState,
    AsyncLedger,
    AsyncThreads,
    InvalidArgument,
    Ledger,
    Threads,
    issue_grant,
    read_claims,
)
from replaysafe_pg.reconcile import ReconcileOutcome, Succeeded


@dataclass(frozen=True)
class Logins:
    worker: str    # DSN of a pooled login: replaysafe_worker, bound to no tenant
    operator: str  # DSN of a pooled login: replaysafe_worker and replaysafe_operator
    issuer: str    # DSN of an issuer login: replaysafe_issuer only


@pytest.fixture
def logins(dsn: str, make_role: Callable[..., str]) -> Logins:
    def as_(role: str) -> str:
        return pg_conninfo.make_conninfo(dsn, user=role)

    return Logins(worker=as_(make_role("replaysafe_worker")),
                  operator=as_(make_role("replaysafe_worker", "replaysafe_operator")),
                  issuer=as_(make_role("replaysafe_issuer")))


def grant_for(logins: Logins, tenant: str, **options: Any) -> str:
    return issue_grant(logins.issuer, tenant, **options)


def owner_rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        return c.execute(query.encode(), params).fetchall()


class Tool:
    """A side effect that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {"refund": f"re_{len(self.calls)}"}


# --- the ledger under a grant ----------------------------------------------------------------

def test_one_pooled_login_runs_for_two_tenants_with_their_grants(dsn: str, logins: Logins) -> None:
    tool = Tool()
    acme, globex = grant_for(logins, "acme"), grant_for(logins, "globex")
    with Ledger(logins.worker, grant=acme, worker_id="pool-1") as a, \
            Ledger(logins.worker, grant=globex, worker_id="pool-1") as g:
        assert (a.tenant_id, g.tenant_id) == ("acme", "globex")
        first = a.run("refund", tool, {"order": 1}, key="order-1")
        assert (first.status, first.replay, first.result) == ("succeeded", False, {"refund": "re_1"})
        # The same key is another action in another tenant: it runs again there.
        other = g.run("refund", tool, {"order": 1}, key="order-1")
        assert (other.status, other.replay, other.result) == ("succeeded", False, {"refund": "re_2"})
        again = a.run("refund", tool, {"order": 1}, key="order-1")
        assert (again.replay, again.result) == (True, {"refund": "re_1"})
    assert len(tool.calls) == 2
    assert owner_rows(dsn, "SELECT tenant_id, action_key, state, worker_id FROM replaysafe.actions "
                           "ORDER BY tenant_id") == [("acme", "order-1", "succeeded", "pool-1"),
                                                     ("globex", "order-1", "succeeded", "pool-1")]


def test_without_a_grant_the_pooled_login_acts_for_nobody(logins: Logins) -> None:
    with Ledger(logins.worker, tenant_id="acme") as led:
        with pytest.raises(AccessDenied):
            led.claim("k", "refund", {})
        assert led.get("k") is None  # the views show it nothing


def test_tenant_id_may_be_omitted_and_must_match_the_grants(logins: Logins) -> None:
    acme = grant_for(logins, "acme")
    nowhere = "host=/nonexistent-socket-dir dbname=none connect_timeout=1"
    # Refused before anything is sent: the DSN leads nowhere and is never tried.
    for make in (lambda: Ledger(nowhere, tenant_id="globex", grant=acme),
                 lambda: AsyncLedger(nowhere, tenant_id="globex", grant=acme),
                 lambda: Threads(nowhere, tenant_id="globex", grant=acme),
                 lambda: AsyncThreads(nowhere, tenant_id="globex", grant=acme),
                 lambda: Ledger(nowhere, tenant_id="default", grant=acme)):
        with pytest.raises(InvalidArgument, match="the grant is for tenant 'acme'"):
            make()
    for bad in ("not a grant", acme + "x", acme.replace(".", ":"), "a.b.c", 42, b"bytes",
                lambda: "nope"):
        with pytest.raises(InvalidArgument) as caught:
            Ledger(nowhere, grant=bad)
        assert acme not in str(caught.value)  # a grant is never echoed
    assert Ledger(nowhere, tenant_id="acme", grant=acme).tenant_id == "acme"
    assert Ledger(nowhere, grant=acme).tenant_id == "acme"
    assert Ledger(nowhere).tenant_id == "default"


def test_statements_without_a_grant_are_those_of_a_bound_login(logins: Logins) -> None:
    from replaysafe_pg import queries
    from replaysafe_pg.statements import Statements

    plain, granted = Statements("acme", "w"), Statements(None, "w", grant_for(logins, "acme"))
    for build in (lambda c: c.claim("k", "op", {}, 30, None, "unknown", None),
                  lambda c: c.sweep(10, None), lambda c: c.purge(60, 10, None),
                  lambda c: c.get("k"), lambda c: c.revoke_grants()):
        bare, with_grant = build(plain), build(granted)
        assert "grant" not in bare.params and "p_grant" not in bare.query
        assert bare.query == queries.get(bare.name, bare.params)
        assert with_grant.params == bare.params | {"grant": granted.grant.current()}
        if queries.takes_grant(bare.name):
            assert queries.GRANT_ARGUMENT in with_grant.query
            assert with_grant.query.replace(queries.GRANT_ARGUMENT, "") == bare.query
        else:
            assert with_grant.query == bare.query  # a view: use_grant goes first instead


def test_an_altered_or_revoked_grant_is_refused_by_the_database(logins: Logins) -> None:
    acme = grant_for(logins, "acme")
    header, _, signature = acme.split(".")
    # Another grant's claims under this one's signature: well formed, not valid.
    other_claims = grant_for(logins, "acme", ttl=timedelta(days=7)).split(".")[1]
    with Ledger(logins.worker, grant=f"{header}.{other_claims}.{signature}") as led:
        with pytest.raises(AccessDenied):
            led.claim("k", "refund", {})
        with pytest.raises(AccessDenied):
            led.get("k")
    with Ledger(logins.worker, grant=acme) as led:
        assert led.claim("k", "refund", {}).outcome == "claimed"


def test_a_callable_grant_is_asked_again_and_refreshed_after_revoke_grants(
        dsn: str, logins: Logins) -> None:
    holder = {"grant": grant_for(logins, "acme", duties=("worker", "operator"))}
    asked: list[str] = []

    def current() -> str:
        asked.append(holder["grant"])
        return holder["grant"]

    tool = Tool()
    with Ledger(logins.operator, grant=current) as led:
        assert led.tenant_id == "acme"
        assert led.run("refund", tool, {"n": 1}, key="k1").status == "succeeded"
        before = len(asked)
        assert led.get("k1") is not None
        assert len(asked) > before  # asked before each statement
        assert led.revoke_grants() == 1
        # The ledger's own grant was issued before: refused from the next call on.
        with pytest.raises(AccessDenied):
            led.run("refund", tool, {"n": 2}, key="k2")
        holder["grant"] = grant_for(logins, "acme", duties=("worker", "operator"))
        assert read_claims(holder["grant"]).generation == 1
        assert led.run("refund", tool, {"n": 2}, key="k2").status == "succeeded"
        assert led.revoke_grants() == 2
        # A callable that turns to another tenant is refused before anything is sent.
        holder["grant"] = grant_for(logins, "globex")
        with pytest.raises(InvalidArgument, match="tenant 'globex'"):
            led.get("k1")
    assert len(tool.calls) == 2
    assert owner_rows(dsn, "SELECT tenant_id, generation FROM replaysafe.grant_generations") \
        == [("acme", 2)]


def test_a_grant_refreshed_while_the_tool_runs_records_its_outcome(
        dsn: str, logins: Logins, caplog: pytest.LogCaptureFixture) -> None:
    """Heartbeats and the outcome's report ask for the grant when they are sent: a grant
    revoked (and replaced) while the tool runs neither loses the lease nor the outcome."""
    holder = {"grant": grant_for(logins, "acme")}

    def tool() -> str:
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute("SELECT replaysafe.revoke_tenant_grants('acme')")
        holder["grant"] = grant_for(logins, "acme")
        time.sleep(2.5)  # several heartbeats, well past the first lease
        return "done"

    with Ledger(logins.worker, grant=lambda: holder["grant"]) as led:
        first = led.run("op", tool, {}, key="k", lease=timedelta(seconds=1.2))
        assert not [r for r in caplog.records if "heartbeat" in r.getMessage()]
        assert (first.status, first.result) == ("succeeded", "done")
        assert led.run("op", tool, {}, key="k").replay is True
    assert repr(led._sql.grant).startswith("<Grant (callable) for tenant 'acme'")
    assert holder["grant"] not in repr(led._sql.grant)


def test_revoke_grants_needs_an_operator(logins: Logins) -> None:
    worker_only = grant_for(logins, "acme")  # duty worker
    with Ledger(logins.operator, grant=worker_only) as led, pytest.raises(AccessDenied):
        led.revoke_grants()
    with Ledger(logins.worker, grant=grant_for(logins, "acme", duties=("worker", "operator"))) \
            as led, pytest.raises(AccessDenied):
        led.revoke_grants()  # the grant gives the duty, the login does not
    with Ledger(logins.worker, tenant_id="acme") as led, pytest.raises(AccessDenied):
        led.revoke_grants()


def test_sweep_and_purge_act_for_the_grants_tenant(dsn: str, logins: Logins) -> None:
    with Ledger(dsn, tenant_id="globex") as owner:
        owner.claim("g", "refund", {}, lease=0.1)
    grant = grant_for(logins, "acme", duties=("worker", "operator"))
    with Ledger(logins.operator, grant=grant) as led:
        led.claim("a", "refund", {}, lease=0.1)
        time.sleep(0.3)
        assert led.sweep() == 1
        assert owner_rows(dsn, "SELECT tenant_id, state FROM replaysafe.actions ORDER BY 1") \
            == [("acme", "unknown"), ("globex", "running")]
        led.resolve("a", "failed", error={"why": "test"}, note="by hand")
        assert led.purge(0) == 1
    assert owner_rows(dsn, "SELECT tenant_id FROM replaysafe.actions") == [("globex",)]


# --- views under a grant: use_grant first, in the same transaction ----------------------------

def test_get_and_attempts_read_the_views_under_the_grant(dsn: str, logins: Logins) -> None:
    acme, globex = grant_for(logins, "acme"), grant_for(logins, "globex")
    with Ledger(logins.worker, grant=acme) as a, Ledger(logins.worker, grant=globex) as g:
        a.run("refund", Tool(), {"order": 1}, key="order-1")
        action = a.get("order-1")
        assert action is not None
        assert (action.tenant_id, action.state, action.result) == (
            "acme", ActionState.SUCCEEDED, {"refund": "re_1"})
        assert [(x.attempt, x.outcome) for x in a.attempts("order-1")] == [(1, "succeeded")]
        assert g.get("order-1") is None and g.attempts("order-1") == []
        # The grant was in force for those reads only: the ledger's own connection, outside
        # their transactions, sees nothing.
        conn = own_connection(a)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT count(*) FROM replaysafe.actions_v").fetchone() == (0,)


def test_views_under_a_grant_on_a_callers_connection(logins: Logins) -> None:
    acme = grant_for(logins, "acme")
    with Ledger(logins.worker, grant=acme) as led:
        led.run("refund", Tool(), {}, key="k")
    # An idle connection that is not autocommit: a transaction of its own, committed at once.
    with psycopg.connect(logins.worker) as conn:
        with Ledger(conn, grant=acme) as led:
            action = led.get("k")
            assert action is not None and action.state == "succeeded"
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # Inside the caller's transaction: both statements join it, and the grant stays in
        # force there until it ends (as use_grant does for anyone).
        with conn.transaction():
            with Ledger(conn, grant=acme) as led:
                assert [a.outcome for a in led.attempts("k")] == ["succeeded"]
            assert conn.execute("SELECT count(*) FROM replaysafe.actions_v").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM replaysafe.actions_v").fetchone() == (0,)
    # Autocommit, and through a pool.
    from psycopg_pool import ConnectionPool

    with psycopg.connect(logins.worker, autocommit=True) as conn, Ledger(conn, grant=acme) as led:
        assert led.get("k") is not None
    with ConnectionPool(logins.worker, min_size=1, max_size=2, open=True) as pool, \
            Ledger(pool, grant=acme) as led:
        assert led.get("k") is not None


def test_reconcile_under_a_grant(dsn: str, logins: Logins) -> None:
    grant = grant_for(logins, "acme", duties=("worker", "operator"))
    with Ledger(logins.operator, grant=grant) as led:
        claim = led.claim("k", "refund", {"order": 7})
        led.mark_unknown(claim, {"why": "timeout"})
        done = led.reconcile({"refund": lambda action: Succeeded({"found": action.action_key},
                                                                 "re_found")})
        assert [(r.action_key, r.outcome) for r in done] == [("k", ReconcileOutcome.SUCCEEDED)]
        action = led.get("k")
        assert action is not None and action.state == "succeeded"
        assert action.provider_reference == "re_found"
    # A worker-only grant reads the work list but may not settle it.
    with Ledger(logins.operator, grant=grant_for(logins, "acme")) as led:
        claim = led.claim("k2", "refund", {})
        led.mark_unknown(claim, {"why": "timeout"})
        with pytest.raises(AccessDenied):
            led.reconcile({"refund": lambda action: Succeeded()})


# --- threads ---------------------------------------------------------------------------------

def test_threads_under_a_user_grant_reach_that_users_threads_only(logins: Logins) -> None:
    u1, u2 = grant_for(logins, "acme", user_id="u1"), grant_for(logins, "acme", user_id="u2")
    with Threads(logins.worker, grant=u1) as mine, Threads(logins.worker, grant=u2) as theirs:
        assert mine.tenant_id == "acme"
        assert mine.write("t1", {"n": 1}, 0) == 1
        assert mine.read("t1").state == {"n": 1}
        assert [v.version for v in mine.history("t1")] == [1]
        for call in (lambda: theirs.read("t1"), lambda: theirs.write("t1", {"n": 2}, 1),
                     lambda: theirs.history("t1"), lambda: theirs.delete("t1")):
            with pytest.raises(AccessDenied):
                call()
        assert theirs.write("t2", {"n": 1}, 0) == 1
        with pytest.raises(AccessDenied):
            mine.read("t2")
    # user_id: the grant's user or omitted.
    with Threads(logins.worker, grant=u1, user_id="u1") as same:
        assert same.read("t1").version == 1
    with pytest.raises(InvalidArgument, match="the grant is for user 'u1'"):
        Threads(logins.worker, grant=u1, user_id="u2")
    # A grant for the whole tenant names no user: the thread's user is as given.
    with Threads(logins.worker, grant=grant_for(logins, "acme"), user_id="u1") as tenant_wide:
        assert tenant_wide.read("t1").version == 1


def test_async_threads_with_a_grant(logins: Logins) -> None:
    grant = grant_for(logins, "acme", user_id="u1")

    async def main() -> None:
        async with AsyncThreads(logins.worker, grant=grant) as th:
            assert await th.write("t", {"a": 1}, 0) == 1
            assert (await th.read("t")).state == {"a": 1}
            assert await th.delete("t") is True

    asyncio.run(main())


# --- the async ledger ------------------------------------------------------------------------

def test_async_ledger_with_a_grant(dsn: str, logins: Logins) -> None:
    holder = {"grant": grant_for(logins, "acme", duties=("worker", "operator"))}
    calls: list[int] = []

    async def tool(n: int) -> dict[str, int]:
        calls.append(n)
        return {"n": n}

    async def main() -> None:
        async with AsyncLedger(logins.operator, grant=lambda: holder["grant"]) as led:
            assert led.tenant_id == "acme"
            first = await led.run("op", tool, {"n": 1}, key="k")
            assert (first.status, first.result) == ("succeeded", {"n": 1})
            assert (await led.run("op", tool, {"n": 1}, key="k")).replay is True
            action = await led.get("k")
            assert action is not None and action.state == "succeeded"
            assert [a.outcome for a in await led.attempts("k")] == ["succeeded"]
            assert await led.revoke_grants() == 1
            with pytest.raises(AccessDenied):
                await led.get("k")  # use_grant refuses a revoked grant
            holder["grant"] = grant_for(logins, "acme", duties=("worker", "operator"))
            assert await led.get("k") is not None
        async with AsyncLedger(logins.worker, grant=grant_for(logins, "globex")) as other:
            assert await other.get("k") is None

    asyncio.run(main())
    assert calls == [1]


def test_an_async_runs_heartbeats_ask_for_the_grant_at_each_beat(
        dsn: str, logins: Logins, caplog: pytest.LogCaptureFixture) -> None:
    """As the sync run: a grant revoked and replaced while the tool runs, and the async
    heartbeats carry the new one from the next beat on (no beat fails, the lease holds)."""
    holder = {"grant": grant_for(logins, "acme")}

    async def tool() -> str:
        await asyncio.sleep(0.6)  # the heartbeats are under way (one every 0.4 s)
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute("SELECT replaysafe.revoke_tenant_grants('acme')")
        holder["grant"] = grant_for(logins, "acme")
        await asyncio.sleep(2.0)  # several more, well past the first lease
        return "done"

    async def main() -> None:
        async with AsyncLedger(logins.worker, grant=lambda: holder["grant"]) as led:
            first = await led.run("op", tool, {}, key="k", lease=timedelta(seconds=1.2))
            assert (first.status, first.result) == ("succeeded", "done")

    asyncio.run(main())
    assert not [r for r in caplog.records if "heartbeat" in r.getMessage()]
    assert owner_rows(dsn, "SELECT state::text, attempt FROM replaysafe.actions") == [
        ("succeeded", 1)]


# --- issuing --------------------------------------------------------------------------------

def test_issue_grant(dsn: str, logins: Logins) -> None:
    grant = issue_grant(logins.issuer, "acme", ttl=timedelta(minutes=5), user_id="u1",
                        duties=["auditor", "worker"])
    claims = read_claims(grant)
    assert (claims.tenant_id, claims.user_id, claims.duties) == ("acme", "u1", ("auditor", "worker"))
    assert claims.expires_at - claims.issued_at == timedelta(minutes=5)
    assert replaysafe_pg.issue_grant is issue_grant and "issue_grant" in replaysafe_pg.__all__
    # The schema owner may issue too; a worker may not.
    assert read_claims(issue_grant(dsn, "acme")).duties == ("worker",)
    with pytest.raises(AccessDenied):
        issue_grant(logins.worker, "acme")
    # Bad arguments are refused before anything is sent.
    nowhere = "host=/nonexistent-socket-dir dbname=none connect_timeout=1"
    for bad in ({"ttl": timedelta(0)}, {"ttl": timedelta(days=8)}, {"ttl": -1},
                {"ttl": "1h"}, {"duties": ["root"]}, {"duties": []}, {"duties": "worker"},
                {"user_id": ""}):
        with pytest.raises(InvalidArgument):
            issue_grant(nowhere, "acme", **bad)
    with pytest.raises(InvalidArgument):
        issue_grant(nowhere, "")
    # A psycopg connection works as well as a DSN.
    with psycopg.connect(logins.issuer, autocommit=True) as conn:
        assert read_claims(issue_grant(conn, "globex", ttl=60)).tenant_id == "globex"


# --- the command line -----------------------------------------------------------------------

def test_cli_grant_issue_and_revoke(dsn: str, logins: Logins) -> None:
    result = run("grant", "issue", "--tenant", "acme", "--user", "u1", "--ttl", "30m",
                 "--duty", "worker", "--duty", "operator", dsn=logins.issuer)
    assert result.exit_code == 0, result.stderr
    grant = result.stdout.strip()
    assert result.stdout == grant + "\n"  # the grant alone
    claims = read_claims(grant)
    assert (claims.tenant_id, claims.user_id, claims.duties) == ("acme", "u1", ("operator", "worker"))
    assert claims.expires_at - claims.issued_at == timedelta(minutes=30)
    with Threads(logins.worker, grant=grant) as th:
        assert th.write("t", {}, 0) == 1

    default = run("--json", "grant", "issue", "--tenant", "acme", dsn=logins.issuer)
    assert default.exit_code == 0, default.stderr
    data = json.loads(default.stdout)
    assert (data["tenant_id"], data["user_id"], data["duties"]) == ("acme", None, ["worker"])
    assert read_claims(data["grant"]).expires_at - read_claims(data["grant"]).issued_at \
        == timedelta(hours=1)

    # Global options after the subcommand's name too.
    after = run("grant", "issue", "--tenant", "acme", "--dsn", logins.issuer)
    assert after.exit_code == 0, after.stderr

    assert_one_line_error(run("grant", "issue", "--tenant", "acme", dsn=logins.worker),
                          "AccessDenied")
    assert_one_line_error(run("grant", "issue", "--tenant", "acme", "--ttl", "8d",
                              dsn=logins.issuer), "ttl")
    bad_duty = run("grant", "issue", "--tenant", "acme", "--duty", "root", dsn=logins.issuer)
    assert bad_duty.exit_code == 2 and "root" in bad_duty.stderr
    bad_ttl = run("grant", "issue", "--tenant", "acme", "--ttl", "soon", dsn=logins.issuer)
    assert bad_ttl.exit_code == 2 and "soon" in bad_ttl.stderr

    revoked = run("--json", "grant", "revoke", "--tenant", "acme", dsn=dsn)
    assert revoked.exit_code == 0, revoked.stderr
    assert json.loads(revoked.stdout) == {"tenant_id": "acme", "generation": 1}
    with Threads(logins.worker, grant=grant) as th, pytest.raises(AccessDenied):
        th.read("t")
    human = run("grant", "revoke", "--tenant", "acme", dsn=dsn)
    assert human.exit_code == 0 and "generation 2" in human.stdout
    assert_one_line_error(run("grant", "revoke", "--tenant", "acme", dsn=logins.worker),
                          "AccessDenied")
