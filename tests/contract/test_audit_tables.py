"""replaysafe_pg.audit matches the views in the database, and composes real audit queries."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from helpers.cli import at
from sqlalchemy.dialects import postgresql

from replaysafe_pg import Ledger, audit
from replaysafe_pg.schema import sqlalchemy_url

VIEWS = [audit.actions_v, audit.action_attempts_v, audit.unresolved_actions,
         audit.multi_effect_actions]


@pytest.fixture
def engine(dsn: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(sqlalchemy_url(dsn), poolclass=sa.NullPool)
    yield eng
    eng.dispose()


def _type(column: sa.Column[object]) -> str:
    text = column.type.compile(dialect=postgresql.dialect())
    if isinstance(column.type, postgresql.TIMESTAMP) and column.type.timezone:
        text += " WITH TIME ZONE"
    return text


@pytest.mark.parametrize("table", VIEWS, ids=lambda t: t.name)
def test_tables_match_the_reflected_views(engine: sa.Engine, table: sa.Table) -> None:
    reflected = sa.Table(table.name, sa.MetaData(schema="replaysafe"), autoload_with=engine)
    assert [c.name for c in table.columns] == [c.name for c in reflected.columns]
    assert {c.name: _type(c) for c in table.columns} == {c.name: _type(c) for c in reflected.columns}


def test_every_view_of_the_schema_has_a_table(engine: sa.Engine) -> None:
    names = set(sa.inspect(engine).get_view_names(schema="replaysafe"))
    assert {t.name for t in VIEWS} <= names


def test_composed_audit_queries(dsn: str, engine: sa.Engine) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for key in ("a", "b"):
            c = led.claim(key, "refund", {"k": key}, lease=timedelta(seconds=30), now=at(0))
            led.complete(c, {"ok": True}, now=at(1))
        led.claim("lost", "refund", {"k": 1}, lease=timedelta(seconds=30), now=at(0))
    a, u = audit.actions_v, audit.unresolved_actions
    with engine.connect() as conn:
        by_state = dict(conn.execute(
            sa.select(a.c.state, sa.func.count()).where(a.c.operation == "refund")
            .group_by(a.c.state)).all())
        assert by_state == {"succeeded": 2, "running": 1}
        stuck = conn.execute(sa.select(u.c.action_key, u.c.age)
                             .where(u.c.age > timedelta(hours=1))).all()
        assert [r.action_key for r in stuck] == ["lost"]
        assert isinstance(stuck[0].age, timedelta)
        joined = conn.execute(
            sa.select(a.c.action_key, sa.func.count(audit.action_attempts_v.c.attempt))
            .join(audit.action_attempts_v,
                  (audit.action_attempts_v.c.tenant_id == a.c.tenant_id)
                  & (audit.action_attempts_v.c.action_key == a.c.action_key))
            .where(audit.action_attempts_v.c.outcome == "succeeded")
            .group_by(a.c.action_key).order_by(a.c.action_key)).all()
        assert [tuple(r) for r in joined] == [("a", 1), ("b", 1)]
        assert conn.execute(sa.select(audit.multi_effect_actions)).all() == []


def _doc_blocks(language: str) -> list[str]:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def test_the_documented_audit_queries_run(dsn: str, engine: sa.Engine) -> None:
    with Ledger(dsn, tenant_id="acme", worker_id="w1") as led:
        c1 = led.claim("twice", "refund", {"order_id": "o_1"}, lease=timedelta(seconds=30),
                       on_expired="reclaim", thread_id="th_1", now=at(0))
        c2 = led.claim("twice", "refund", {"order_id": "o_1"}, lease=timedelta(seconds=30),
                       on_expired="reclaim", thread_id="th_1", now=at(60))
        led.complete(c2, {"ok": 2}, now=at(61))
        led.complete(c1, {"ok": 1}, now=at(62))
        led.claim("lost", "refund", {"order_id": "o_2"}, lease=timedelta(seconds=30), now=at(0))
        led.claim("lost", "refund", {"order_id": "o_2"}, lease=timedelta(seconds=30), now=at(60))
    blocks = _doc_blocks("sql")
    assert len(blocks) >= 8
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        for sql in blocks:
            driver.execute(sql).fetchall()
        multi = driver.execute(blocks[1]).fetchall()
        assert multi == [("acme", "twice", "refund", 2, ["w1", "w1"])]
    # The Python block: build every query against the real database (but its own engine).
    (python,) = _doc_blocks("python")
    namespace: dict[str, object] = {}
    exec(python.split("with engine.connect()")[0].replace(
        'sa.create_engine("postgresql+psycopg://auditor@db/app")', "ENGINE"),
        {"ENGINE": engine} | namespace, namespace)
    with engine.connect() as conn:
        stale = conn.execute(namespace["stale_unknown"]).all()  # type: ignore[call-overload]
        assert [r.action_key for r in stale] == ["lost"]
        assert conn.execute(namespace["needs_attention"]).all()  # type: ignore[call-overload]
        assert conn.execute(namespace["retries"]).all()  # type: ignore[call-overload]
        conn.execute(sa.text("CREATE TEMP TABLE orders (id text, customer text)"))
        conn.execute(sa.text("INSERT INTO orders VALUES ('o_1', 'ada')"))
        refunded = conn.execute(namespace["refunded_twice"]).all()  # type: ignore[call-overload]
        assert [tuple(r) for r in refunded] == [("ada", "twice")]
