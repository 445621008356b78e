"""The driver through a real PgBouncer, as bound worker logins: every outcome recorded as it
happened, waits that hold no pooled connection, wake-ups within a second or two, and the
threads, the savers, reconcile and the command line in both pool modes."""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers import cli
from helpers.db import own_connection
from helpers.pgbouncer import PgBouncer
from helpers.run import ROOT, add_effect, count_effects, make_effects_table
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from replaysafe_pg import AsyncLedger, Ledger, LoginRefused, Threads
from replaysafe_pg.reconcile import Succeeded


class Declined(Exception):
    """What the failing tools raise."""


def _outcomes(direct: str, keys: list[str]) -> dict[str, tuple[str, Any, Any]]:
    with psycopg.connect(direct, autocommit=True) as c:
        rows = c.execute("SELECT action_key, state::text, result, error FROM replaysafe.actions "
                         "WHERE action_key = ANY(%s)", (keys,)).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def _mixed_round(ledgers: list[Ledger], prefix: str, calls: int) -> dict[str, str]:
    """Each ledger in its own thread runs ``calls`` tools: successes, retryable and final
    failures, interleaved, so that their statements share the pooler's server connections.
    Answers what each key's action must say."""
    expected: dict[str, str] = {}
    errors: list[BaseException] = []

    def work(n: int, ledger: Ledger) -> None:
        try:
            for i in range(calls):
                key, kind = f"{prefix}-{n}-{i}", ("ok", "retry", "final")[(i + n) % 3]
                expected[key] = kind

                def tool(kind: str = kind, key: str = key) -> dict[str, str]:
                    if kind != "ok":
                        raise Declined(f"{kind} {key}")
                    return {"done": key}

                ex = ledger.run("op", tool, {}, key=key, lease=5,
                                retryable=Declined if kind == "retry" else None)
                assert ex.status == ("succeeded" if kind == "ok" else "failed"), (key, ex)
                assert ex.retryable == (kind == "retry"), (key, ex)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n, led)) for n, led in enumerate(ledgers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return expected


def test_two_ledgers_sharing_server_connections_record_every_outcome(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    """Two client connections of one login through a transaction pool of two server
    connections: a failure is recorded as that failure, never as another call's success."""
    through = transaction_bouncer.through(worker_login("t1"))
    for round_ in range(5):
        ledgers = [Ledger(through, tenant_id="t1", worker_id=f"w{n}") for n in range(2)]
        try:
            expected = _mixed_round(ledgers, f"r{round_}", 12)
        finally:
            for led in ledgers:
                led.close()
        stored = _outcomes(dsn, list(expected))
        for key, kind in expected.items():
            state, result, error = stored[key]
            if kind == "ok":
                assert (state, result, error) == ("succeeded", {"done": key}, None), key
            else:
                final = "retryable" if kind == "retry" else "failed"
                assert state == final and result is None, (key, stored[key])
                assert f"{kind} {key}" in str(error), (key, error)


def test_through_a_pooler_the_statements_go_unnamed(
        dsn: str, bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    """The probe sees that the server session is not the connection's own (PgBouncer makes up
    the backend pid of its startup answer): nothing is prepared there."""
    through = bouncer.through(worker_login("t1"))
    with Ledger(through, tenant_id="t1") as ledger:
        for i in range(6):
            assert ledger.get(f"k{i}") is None
        conn = own_connection(ledger)
        assert conn.__dict__["_replaysafe_own_session"] is False
        if bouncer.pool_mode == "session":
            assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
    # Nothing left on the shared server sessions that another client of the login could
    # replace with a statement of its own under the same name.
    with psycopg.connect(through, autocommit=True) as other:
        for _ in range(4):
            assert other.execute("SELECT count(*) FROM pg_prepared_statements",
                                 prepare=False).fetchone() == (0,)


def test_prepare_true_behind_a_transaction_pooler_falls_back_to_unnamed(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    """Told to prepare behind a transaction pooler, the second client's statement names meet
    the first's on the shared server connection (42P05, or 26000 where a statement lands on
    another one): refused before anything runs, sent again unnamed, unnamed from then on.
    Between clients of the driver a name always means the same statement; a client that
    replaces one on purpose is another matter (docs/deploying.md: never prepare=True
    through a transaction pooler)."""
    through = transaction_bouncer.through(worker_login("t1"))
    with Ledger(through, tenant_id="t1", prepare=True) as first, \
            Ledger(through, tenant_id="t1", prepare=True) as second:
        first.run("op", lambda: {"x": 1}, {}, key="k")
        for _ in range(6):
            assert first.get("k").result == {"x": 1}  # type: ignore[union-attr]
        for _ in range(6):
            assert second.get("k").result == {"x": 1}  # type: ignore[union-attr]
        assert own_connection(second).__dict__.get("_replaysafe_unnamed") is True
        for round_ in range(2):
            expected = _mixed_round([first, second], f"p{round_}", 9)
            assert {k: v[0] for k, v in _outcomes(dsn, list(expected)).items()} == {
                k: {"ok": "succeeded", "retry": "retryable", "final": "failed"}[kind]
                for k, kind in expected.items()}


def _twenty_callers(conninfo: str, pool_size: int, *, listen: str | bool = True
                    ) -> tuple[list[Any], float, list[float]]:
    """20 threads ``run`` one key on one ledger over a pool of ``pool_size``: their answers,
    when the owner's record was written, when each caller got its answer."""
    make = threading.Lock()
    ran: list[float] = []
    back: list[float] = []
    answers: list[Any] = []
    with ConnectionPool(conninfo, min_size=1, max_size=pool_size, open=True,
                        kwargs={"autocommit": True}) as pool, \
            Ledger(pool, tenant_id="t1", listen=listen) as ledger:

        def tool() -> dict[str, int]:
            time.sleep(0.5)
            with make:
                ran.append(time.monotonic())
            return {"refund": 1}

        def call() -> None:
            ex = ledger.run("refund", tool, {}, key="one", lease=10, wait_timeout=20)
            with make:
                answers.append(ex)
                back.append(time.monotonic())

        threads = [threading.Thread(target=call) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return answers, ran[0] if ran else float("nan"), back


def _assert_one_effect_all_back(answers: list[Any], ran: list[float] | float,
                                back: list[float], within: float) -> None:
    assert len(answers) == 20
    assert {a.status for a in answers} == {"succeeded"}, [a.status for a in answers]
    assert sum(not a.replay for a in answers) == 1
    late = max(back) - (ran if isinstance(ran, float) else ran[0])
    assert late <= within, f"the last caller came back {late:.2f} s after the tool returned"


@pytest.mark.parametrize("pool_size", [1, 2, 4, 20])
@pytest.mark.parametrize("where", ["direct", "session", "transaction"])
def test_twenty_callers_on_one_key_through_a_pool_of_any_size(
        dsn: str, request: pytest.FixtureRequest, worker_login: Callable[..., str],
        pool_size: int, where: str) -> None:
    login = worker_login("t1")
    if where != "direct":
        login = request.getfixturevalue(f"{where}_bouncer").through(login)
    # Through a session pooler LISTEN works, but the driver cannot tell it from a transaction
    # pooler: it is told so (docs/deploying.md). Through a transaction pooler, the default.
    listen: str | bool = login if where == "session" else True
    answers, ran, back = _twenty_callers(login, pool_size, listen=listen)
    _assert_one_effect_all_back(answers, ran, back, 2.0 if where == "transaction" else 1.0)


def test_no_listen_is_left_on_a_transaction_poolers_server_sessions(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    """LISTEN there would stay on whichever server session ran it, for other clients: the
    listener's probe sees the pooler and never LISTENs (the waiters poll)."""
    through = transaction_bouncer.through(worker_login("t1"))
    answers, ran, back = _twenty_callers(through, 2)
    _assert_one_effect_all_back(answers, ran, back, 2.0)
    # Both server sessions of the login's pool at once: each of two open transactions holds one.
    with psycopg.connect(through) as one, psycopg.connect(through) as two:
        pids = set()
        for c in (one, two):
            row = c.execute("SELECT pg_backend_pid(), (SELECT count(*) FROM "
                            "pg_listening_channels())", prepare=False).fetchone()
            assert row is not None and row[1] == 0
            pids.add(row[0])
        assert len(pids) == 2


def test_waiters_wake_by_claiming_every_second_without_a_listen_session(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    answers, ran, back = _twenty_callers(transaction_bouncer.through(worker_login("t1")), 2,
                                         listen=False)
    _assert_one_effect_all_back(answers, ran, back, 2.0)


def test_waiters_listen_on_a_direct_dsn_behind_a_transaction_pooler(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    direct = worker_login("t1")
    answers, ran, back = _twenty_callers(transaction_bouncer.through(direct), 2, listen=direct)
    _assert_one_effect_all_back(answers, ran, back, 1.0)


@pytest.mark.parametrize("pool_size", [1, 20])
def test_async_callers_on_one_key_through_a_transaction_pool(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str],
        pool_size: int) -> None:
    conninfo = transaction_bouncer.through(worker_login("t1"))

    async def body() -> tuple[list[Any], list[float], list[float]]:
        ran: list[float] = []
        back: list[float] = []
        async with AsyncConnectionPool(conninfo, min_size=1, max_size=pool_size, open=False,
                                       kwargs={"autocommit": True}) as pool, \
                AsyncLedger(pool, tenant_id="t1") as ledger:

            async def tool() -> dict[str, int]:
                await asyncio.sleep(0.5)
                ran.append(time.monotonic())
                return {"refund": 1}

            async def call() -> Any:
                ex = await ledger.run("refund", tool, {}, key="one", lease=10,
                                      wait_timeout=20)
                back.append(time.monotonic())
                return ex

            answers = await asyncio.gather(*(call() for _ in range(20)))
        return list(answers), ran, back

    answers, ran, back = asyncio.run(body())
    _assert_one_effect_all_back(answers, ran, back, 2.0)


def _storm_process(through: str, direct: str, n: int, keys: int, out: Any) -> None:
    try:
        out.put(_storm(through, direct, n, keys))
    except BaseException as exc:
        out.put(f"process {n} failed: {exc!r}")


def _storm(through: str, direct: str, n: int, keys: int) -> int:
    wrong = 0
    with Ledger(through, tenant_id="t1", worker_id=f"p{n}") as ledger:
        for round_ in range(3):
            for i in range(keys):
                key = f"s{(i + n + round_) % keys}"

                def tool(key: str = key) -> dict[str, str]:
                    add_effect(direct, key, f"p{n}")
                    time.sleep(0.01)
                    return {"refunded": key}

                ex = ledger.run("refund", tool, {}, key=key, lease=5, wait_timeout=10)
                if ex.status != "succeeded" or ex.result != {"refunded": key}:
                    wrong += 1
    return wrong


def test_a_storm_of_eight_processes_through_a_transaction_pooler(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    make_effects_table(dsn)
    logins = [transaction_bouncer.through(worker_login("t1")) for _ in range(2)]
    keys = 30
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_storm_process, args=(logins[n % 2], dsn, n, keys, out))
             for n in range(8)]
    for p in procs:
        p.start()
    wrong = [out.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * 8
    assert wrong == [0] * 8, "a caller got another outcome than the key's"
    assert [count_effects(dsn, f"s{i}") for i in range(keys)] == [1] * keys
    with psycopg.connect(dsn, autocommit=True) as c:
        states = c.execute("SELECT state::text, count(*) FROM replaysafe.actions "
                           "GROUP BY 1").fetchall()
    assert states == [("succeeded", keys)], "nothing stuck running or unknown"


def test_threads_the_ledger_and_reconcile_in_both_modes(
        dsn: str, bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    through = bouncer.through(worker_login("t1", "replaysafe_worker, replaysafe_operator"))
    with Threads(through, tenant_id="t1") as threads:
        version = 0
        for step in range(8):
            version = threads.write("th", {"step": step}, expected_version=version)
        assert threads.read("th").state == {"step": 7}
        assert len(threads.history("th", limit=3)) == 3
    with Ledger(through, tenant_id="t1") as ledger:
        for i in range(8):
            claim = ledger.claim(f"k{i}", "refund", {"order": i}, lease=5)
            ledger.mark_unknown(claim, {"crashed": True})
        results = ledger.reconcile({"refund": lambda action: Succeeded({"order": 1})})
        assert len(results) == 8
        assert {ledger.get(f"k{i}").state for i in range(8)} == {"succeeded"}  # type: ignore[union-attr]


def test_the_langgraph_savers_in_both_modes(
        dsn: str, bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    from helpers.lg_graphs import achain_graph, chain_graph

    from replaysafe_pg.langgraph import AsyncReplaysafeSaver, ReplaysafeSaver

    through = bouncer.through(worker_login("t1"))
    with ReplaysafeSaver(through, tenant_id="t1") as saver:
        graph = chain_graph(saver, [])
        for n in range(4):  # past psycopg's prepare threshold
            config = {"configurable": {"thread_id": f"s{n}", "runner": "sync"}}
            out = graph.invoke({"log": []}, config, durability="sync")
            assert out["log"] == ["sync:a", "sync:b", "sync:c"]
            assert len(list(graph.get_state_history(config))) == 5

    async def body() -> None:
        async with AsyncReplaysafeSaver(through, tenant_id="t1") as saver:
            graph = achain_graph(saver, [])
            for n in range(4):
                config = {"configurable": {"thread_id": f"a{n}", "runner": "async"}}
                out = await graph.ainvoke({"log": []}, config, durability="sync")
                assert out["log"] == ["async:a", "async:b", "async:c"]

    asyncio.run(body())


def test_the_command_line_in_both_modes(
        dsn: str, bouncer: PgBouncer, worker_login: Callable[..., str]) -> None:
    through = bouncer.through(worker_login("t1"))
    with Ledger(through, tenant_id="t1") as ledger:
        for i in range(6):
            ledger.run("refund", lambda: {"ok": True}, {}, key=f"c{i}")
    owner = bouncer.through(dsn)
    for _ in range(6):  # more than psycopg's prepare threshold
        listed = cli.run_json("actions", "list", dsn=owner)
        assert len(listed) == 6
    result = cli.run("audit", dsn=owner)
    assert result.exit_code == 0, result.output
    result = cli.run("doctor", dsn=owner)
    assert "FAIL" not in result.output, result.output


def test_the_example_of_docs_deploying_runs(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    direct = worker_login("acme")
    monkeypatch.setenv("POOLED_DSN", transaction_bouncer.through(direct))
    monkeypatch.setenv("DIRECT_DSN", direct)
    text = (ROOT / "docs" / "deploying.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/deploying.md", "exec"), {})


@pytest.mark.parametrize("what", ["an unknown login", "a startup parameter"])
def test_a_refusal_for_good_is_not_retried(
        dsn: str, transaction_bouncer: PgBouncer, worker_login: Callable[..., str],
        what: str) -> None:
    """PgBouncer refuses a login it does not know and any startup ``options``: ``run`` says
    so at once (``LoginRefused``) instead of retrying for its lease."""
    through = transaction_bouncer.through(worker_login("t1"))
    if what == "an unknown login":
        through = psycopg.conninfo.make_conninfo(through, user="nobody_knows_me")
    else:
        through = psycopg.conninfo.make_conninfo(through, options="-c statement_timeout=5s")
    started = time.monotonic()
    with Ledger(through, tenant_id="t1") as ledger, \
            pytest.raises(LoginRefused, match=r"authentication failed|unsupported startup parameter"):
        ledger.run("refund", lambda: {"ok": True}, {}, key="k", lease=30)
    assert time.monotonic() - started < 5
