"""A real PgBouncer in front of the test server, in transaction and in session mode, with
its default settings (listen address, auth file and pool size aside). Without the
``pgbouncer`` program the tests are skipped, except under CI, which installs it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from helpers import pgbouncer
from helpers.db import bind

# Server connections per (database, login): small, so that clients share them.
TRANSACTION_POOL_SIZE = 2
SESSION_POOL_SIZE = 60


def _require_pgbouncer() -> None:
    if not pgbouncer.available():
        if os.environ.get("CI"):
            pytest.fail("CI runs the pooler tests: .ci/run installs Debian's pgbouncer")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")


@pytest.fixture(scope="session")
def transaction_bouncer(admin_dsn: str) -> Iterator[pgbouncer.PgBouncer]:
    _require_pgbouncer()
    with pgbouncer.running(admin_dsn, pool_mode="transaction",
                           pool_size=TRANSACTION_POOL_SIZE) as bouncer:
        yield bouncer


@pytest.fixture(scope="session")
def session_bouncer(admin_dsn: str) -> Iterator[pgbouncer.PgBouncer]:
    _require_pgbouncer()
    with pgbouncer.running(admin_dsn, pool_mode="session",
                           pool_size=SESSION_POOL_SIZE) as bouncer:
        yield bouncer


@pytest.fixture(params=["transaction", "session"])
def bouncer(request: pytest.FixtureRequest) -> pgbouncer.PgBouncer:
    fixture: pgbouncer.PgBouncer = request.getfixturevalue(f"{request.param}_bouncer")
    return fixture


@pytest.fixture
def worker_login(dsn: str, admin_dsn: str) -> Iterator[Callable[..., str]]:
    """A LOGIN role, member of replaysafe_worker (or of ``groups``), bound to a tenant:
    ``make(tenant)`` answers the direct DSN of it (for ``bouncer.through``)."""
    created: list[str] = []

    def make(tenant: str, groups: str = "replaysafe_worker") -> str:
        role = f"rs_pool_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE {groups}')
        created.append(role)
        bind(dsn, role, tenant)
        return psycopg.conninfo.make_conninfo(dsn, user=role)

    yield make
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for role in created:
            c.execute(f'DROP ROLE IF EXISTS "{role}"')
