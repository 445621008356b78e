"""Real Postgres for every test.

Server: ``REPLAYSAFE_TEST_DSN`` (a role that may create databases and roles), else a
testcontainers Postgres when a Docker daemon answers, else an embedded Postgres in a temp
dir. The schema is migrated once into a template database; each test gets a fresh clone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

warnings.filterwarnings("ignore", module="platformdirs")

import psycopg
import pytest
from helpers.db import clone_database, drop_database, dsn_for

import replaysafe_pg
from replaysafe_pg import embedded

# Test-only settings: durability off, so cloning databases is cheap. Benchmarks use their
# own server with the defaults. Prepared transactions: tests/sql/isolation/test_restricted_operation_probe.py.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                 "max_connections": "200", "max_prepared_transactions": "10"}


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    env = os.environ.get("REPLAYSAFE_TEST_DSN")
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:17", driver=None) as pg:
            yield pg.get_connection_url()
        return
    tmp = Path(tempfile.mkdtemp(prefix="replaysafe-test-", dir="/tmp"))
    server = embedded.start(tmp / "pgdata", settings=FAST_SETTINGS)
    try:
        yield server.dsn
    finally:
        embedded.stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(admin_dsn: str) -> Iterator[str]:
    name = f"rs_tpl_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    replaysafe_pg.migrate(dsn_for(admin_dsn, name))
    yield name
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database of its own for this test."""
    name = clone_database(admin_dsn, template_db)
    yield dsn_for(admin_dsn, name)
    drop_database(admin_dsn, name)


@pytest.fixture
def empty_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database without the replaysafe schema."""
    name = f"rs_e_{os.getpid()}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield dsn_for(admin_dsn, name)
    drop_database(admin_dsn, name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def ledger(dsn: str) -> Iterator[replaysafe_pg.Ledger]:
    with replaysafe_pg.Ledger(dsn, tenant_id="t1", worker_id="w1") as led:
        yield led


@pytest.fixture
def make_role(admin_dsn: str) -> Iterator[object]:
    """Create LOGIN roles (cluster-wide) for a test; dropped afterwards."""
    created: list[str] = []

    def make(*grants: str) -> str:
        name = f"rs_role_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'CREATE ROLE "{name}" LOGIN')
            for g in grants:
                c.execute(f'GRANT "{g}" TO "{name}"')
        created.append(name)
        return name

    yield make
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for name in created:
            # A closed session's backend drops its temporary objects (owned by the role) after
            # the client has gone: wait for the role's backends to end before dropping it.
            deadline = time.monotonic() + 10
            while c.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s",
                            (name,)).fetchone() != (0,) and time.monotonic() < deadline:
                time.sleep(0.02)
            c.execute(f'DROP ROLE IF EXISTS "{name}"')
