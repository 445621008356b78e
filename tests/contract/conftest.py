"""Fixtures of the contract tier."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import conninfo as pg_conninfo


@pytest.fixture
def new_db(admin_dsn: str) -> Iterator[Callable[[], str]]:
    """Make empty databases (dropped afterwards); returns their DSNs."""
    made: list[str] = []

    def make() -> str:
        name = f"rs_m_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return pg_conninfo.make_conninfo(admin_dsn, dbname=name)

    yield make
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for name in made:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
