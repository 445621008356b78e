"""Fixtures shared by the isolation tests (tests/sql/isolation)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import connect_as
from helpers.seeded_tenants import seed_tenants

Conn = psycopg.Connection[Any]


@pytest.fixture
def seeded_world(dsn: str) -> str:
    """Tenants A and B, each with a finished action, a live lease (its attempt token in
    helpers.seeded_tenants.TOKENS) and a thread, in the test's database."""
    seed_tenants(dsn)
    return dsn


@pytest.fixture
def login_as(dsn: str) -> Iterator[Callable[..., Conn]]:
    """Connect (autocommit) as a role, to the test's database or to ``db``; closed after."""
    with contextlib.ExitStack() as stack:
        def connect(role: str, db: str = dsn) -> Conn:
            return stack.enter_context(connect_as(db, role))
        yield connect
