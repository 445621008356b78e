"""SPEC §4, "shared machinery is never held hostage by one tenant", with §2's sweep and purge: an
all-tenant sweep or purge shares its batch between the tenants with due actions, a
tenant-bound one touches its tenant only, and a row that another transaction holds is
skipped instead of waited for. Real LOGIN roles on real connections; a lock is held by a
tenant's worker in an open transaction on a connection of its own."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, bind_to_all_tenants, owner_rows, sqlstate
from helpers.grants import table_state
from helpers.shared_batches import (
    PURGE,
    SWEEP,
    claim,
    complete,
    expired_leases,
    finished_actions,
    one,
    state_of,
    states,
)

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


Login = Callable[..., Conn]


# --- writing as the schema owner (who may pass any p_now) ----------------------------------


# --- round-robin across tenants -----------------------------------------------------------

def test_an_all_tenant_sweep_shares_its_batch_between_the_tenants(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        expired_leases(owner, "A", 1000, ago="3 hours")  # the backlog, and the oldest
        expired_leases(owner, "B", 3, ago="2 hours")
        expired_leases(owner, "C", 3, ago="2 hours")
        assert one(owner, SWEEP, (10,)) == 10
        assert states(dsn) == Counter({("A", "unknown"): 4, ("A", "running"): 996,
                                       ("B", "unknown"): 3, ("C", "unknown"): 3})
        assert one(owner, SWEEP, (10,)) == 10  # only A has due leases left
        assert states(dsn) == Counter({("A", "unknown"): 14, ("A", "running"): 986,
                                       ("B", "unknown"): 3, ("C", "unknown"): 3})


def test_an_all_tenant_purge_shares_its_batch_between_the_tenants(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        finished_actions(owner, "A", 1000, ago="3 hours")
        finished_actions(owner, "B", 3, ago="2 hours")
        finished_actions(owner, "C", 3, ago="2 hours")
        assert one(owner, PURGE, (10,)) == 10
        assert states(dsn) == Counter({("A", "succeeded"): 996})
        assert one(owner, PURGE, (10,)) == 10
        assert states(dsn) == Counter({("A", "succeeded"): 986})


@pytest.mark.parametrize("call", ["sweep", "purge"])
def test_repeated_all_tenant_batches_drain_every_tenant(dsn: str, call: str) -> None:
    """The first batch serves B beside A's backlog and is full (what B's share leaves goes
    to A's oldest), the calls drain every tenant, and only the last one returns 0."""
    make, query = (expired_leases, SWEEP) if call == "sweep" else (finished_actions, PURGE)
    done = "unknown" if call == "sweep" else None
    with psycopg.connect(dsn, autocommit=True) as owner:
        make(owner, "A", 30, ago="3 hours")
        make(owner, "B", 1, ago="2 hours")
        batches = [one(owner, query, (10,))]
        assert state_of(dsn, "B", f"{'lease' if call == 'sweep' else 'done'}_1") == done
        while batches[-1] and len(batches) < 20:
            batches.append(one(owner, query, (10,)))
    assert batches[-1] == 0 and 0 not in batches[:-1], batches
    assert sum(batches) == 31 and batches[:3] == [10, 10, 10], batches
    left = Counter({("A", "unknown"): 30, ("B", "unknown"): 1}) if call == "sweep" else Counter()
    assert states(dsn) == left


def test_a_tenant_bound_operators_sweep_and_purge_touch_only_its_tenant(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        for t in ("A", "B", "C"):
            expired_leases(owner, t, 3, ago="1 hour")
            finished_actions(owner, t, 3, ago="1 hour")
    operator = make_role("replaysafe_operator")
    bind(dsn, operator, "B")
    c = login_as(operator)
    before = table_state(dsn)
    assert sqlstate(c, "SELECT replaysafe.sweep_expired_actions(p_tenant_id => 'A')") == "RS004"
    assert sqlstate(c, "SELECT replaysafe.purge_actions(p_older_than => '0', "
                       "p_tenant_id => 'C')") == "RS004"
    assert table_state(dsn) == before
    assert one(c, SWEEP, (100,)) == 3
    assert one(c, PURGE, (100,)) == 3
    assert states(dsn) == Counter({("A", "running"): 3, ("A", "succeeded"): 3,
                                   ("B", "unknown"): 3,
                                   ("C", "running"): 3, ("C", "succeeded"): 3})
    assert one(c, "SELECT replaysafe.sweep_expired_actions(p_tenant_id => 'B')") == 0


# --- locks never stall the shared machinery ------------------------------------------------

@pytest.fixture(params=["owner", "all_tenant_operator"])
def sweeper(request: pytest.FixtureRequest, dsn: str, make_role: MakeRole,
            login_as: Login) -> Conn:
    """Who runs the shared machinery: the schema owner, or an operator bound to every
    tenant; waiting for a lock fails after 10 s instead of hanging."""
    if request.param == "owner":
        c = psycopg.connect(dsn, autocommit=True)
        request.addfinalizer(c.close)
    else:
        operator = make_role("replaysafe_operator")
        bind_to_all_tenants(dsn, operator)
        c = login_as(operator)
    c.execute("SET lock_timeout = '10s'")
    return c


def timed(c: Conn, query: str, params: Any = None) -> tuple[Any, float]:
    start = time.monotonic()
    value = one(c, query, params)
    return value, time.monotonic() - start


def holds_lock(dsn: str, query: str, params: Any) -> bool:
    """Whether another transaction holds a row ``query`` (… FOR UPDATE NOWAIT) locks."""
    with psycopg.connect(dsn) as c:
        try:
            c.execute(query.encode(), params)
        except psycopg.errors.LockNotAvailable:
            return True
        finally:
            c.rollback()
    return False


ACTION_ROW = ("SELECT 1 FROM replaysafe.actions WHERE tenant_id = %s AND action_key = %s "
              "FOR UPDATE NOWAIT")


ATTEMPT_ROW = ("SELECT 1 FROM replaysafe.action_attempts WHERE tenant_id = %s "
               "AND action_key = %s AND attempt = %s FOR UPDATE NOWAIT")


@pytest.fixture
def worker_of_a(dsn: str, make_role: MakeRole, login_as: Login) -> Conn:
    """A worker bound to tenant A: the one whose open transaction holds A's row."""
    role = make_role("replaysafe_worker")
    bind(dsn, role, "A")
    return login_as(role)


def test_a_shared_sweep_skips_a_lease_another_transaction_holds(
        dsn: str, sweeper: Conn, worker_of_a: Conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        attempt, token = claim(owner, "A", "held", lease="1 second", ago="1 hour")
        expired_leases(owner, "A", 2, ago="1 hour")
        expired_leases(owner, "B", 2, ago="1 hour")
    worker_of_a.execute("BEGIN")
    assert complete(worker_of_a, "A", "held", attempt, token) == "recorded"  # not committed
    assert holds_lock(dsn, ACTION_ROW, ("A", "held"))
    swept, elapsed = timed(sweeper, SWEEP, (100,))
    assert elapsed < 5
    assert swept == 4
    assert states(dsn) == Counter({("A", "running"): 1, ("A", "unknown"): 2,
                                   ("B", "unknown"): 2})
    worker_of_a.execute("COMMIT")
    assert state_of(dsn, "A", "held") == "succeeded"
    assert one(sweeper, SWEEP, (100,)) == 0


def test_a_shared_purge_skips_an_action_another_transaction_holds(
        dsn: str, sweeper: Conn, worker_of_a: Conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        attempt, token = claim(owner, "A", "held", ago="1 hour")
        assert complete(owner, "A", "held", attempt, token, ago="1 hour") == "recorded"
        finished_actions(owner, "A", 2, ago="1 hour")
        finished_actions(owner, "B", 2, ago="1 hour")
    # The attempt's report again, in an open transaction: it holds the finished action.
    worker_of_a.execute("BEGIN")
    assert complete(worker_of_a, "A", "held", attempt, token) == "superseded"
    assert holds_lock(dsn, ACTION_ROW, ("A", "held"))
    purged, elapsed = timed(sweeper, PURGE, (100,))
    assert elapsed < 5
    assert purged == 4
    assert states(dsn) == Counter({("A", "succeeded"): 1})
    worker_of_a.execute("COMMIT")
    assert one(sweeper, PURGE, (100,)) == 1
    assert states(dsn) == Counter()


def test_a_shared_purge_skips_an_action_whose_attempt_row_another_transaction_holds(
        dsn: str, sweeper: Conn, worker_of_a: Conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        first, first_token = claim(owner, "A", "old", lease="1 second", ago="1 hour",
                                   on_expired="reclaim")
        second, second_token = claim(owner, "A", "old", on_expired="reclaim")
        assert (first, second) == (1, 2)
        assert complete(owner, "A", "old", second, second_token) == "recorded"
        finished_actions(owner, "A", 2, ago="1 hour")
        finished_actions(owner, "B", 2, ago="1 hour")
    # The older attempt's report, superseded, in an open transaction: it holds that
    # attempt's row and not the action's.
    worker_of_a.execute("BEGIN")
    assert complete(worker_of_a, "A", "old", first, first_token) == "superseded"
    assert not holds_lock(dsn, ACTION_ROW, ("A", "old"))
    assert holds_lock(dsn, ATTEMPT_ROW, ("A", "old", 1))
    purged, elapsed = timed(sweeper, PURGE, (100,))
    assert elapsed < 5
    assert purged == 4
    assert states(dsn) == Counter({("A", "succeeded"): 1})
    assert owner_rows(dsn, "SELECT attempt FROM replaysafe.action_attempts "
                           "WHERE tenant_id = 'A' AND action_key = 'old' ORDER BY 1") == [(1,), (2,)]
    worker_of_a.execute("COMMIT")
    assert one(sweeper, PURGE, (100,)) == 1
    assert owner_rows(dsn, "SELECT count(*) FROM replaysafe.action_attempts") == [(0,)]


@pytest.mark.parametrize("call", ["sweep", "purge"])
def test_a_held_row_never_empties_a_shared_batch_while_another_tenant_is_due(
        dsn: str, worker_of_a: Conn, call: str) -> None:
    """Tenant A's oldest due action is held by A's open transaction; B's is due too. A
    batch across tenants goes on with B, even one of a single action: "0" would tell the
    caller (who calls until 0) that nothing is due, for as long as A holds its row."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("SET lock_timeout = '10s'")
        if call == "sweep":
            attempt, token = claim(owner, "A", "held", lease="1 second", ago="3 hours")
            expired_leases(owner, "B", 1, ago="1 hour")
            worker_of_a.execute("BEGIN")
            assert complete(worker_of_a, "A", "held", attempt, token) == "recorded"
        else:
            attempt, token = claim(owner, "A", "held", ago="3 hours")
            assert complete(owner, "A", "held", attempt, token, ago="3 hours") == "recorded"
            finished_actions(owner, "B", 1, ago="1 hour")
            worker_of_a.execute("BEGIN")
            assert complete(worker_of_a, "A", "held", attempt, token) == "superseded"
        assert holds_lock(dsn, ACTION_ROW, ("A", "held"))
        count, elapsed = timed(owner, SWEEP if call == "sweep" else PURGE, (1,))
        assert elapsed < 5
        assert count == 1
        worker_of_a.execute("COMMIT")
