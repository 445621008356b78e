"""Fixtures shared by the sql tier's LangGraph tests (tests/sql/langgraph). langgraph itself
is imported inside ``checkpointed_world`` only: test_stored_checkpoints.py runs without it."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest
from helpers.db import bind
from helpers.langgraph_fast_path import PUT_FAST, fast_params

import replaysafe_pg


@pytest.fixture
def checkpointed_world(dsn: str) -> str:
    """Tenants A and B, each with a thread "t" (and B with "secret"), written by the owner."""
    from helpers.langgraph_rows import seed_thread

    from replaysafe_pg.langgraph import ReplaysafeSaver

    with ReplaysafeSaver(dsn, tenant_id="A") as a, ReplaysafeSaver(dsn, tenant_id="B") as b:
        seed_thread(a, "t", "A")
        seed_thread(b, "t", "B")
        seed_thread(b, "secret", "B")
    return dsn


@pytest.fixture
def installed_revision(dsn: str) -> str:
    """The revision the test's database is at (the head)."""
    revision = replaysafe_pg.current_revision(dsn)
    assert revision is not None
    return revision


@pytest.fixture
def fast_path_world(dsn: str, installed_revision: str) -> str:
    """Tenant A's thread t: p0 <- p1 (the head), stored by the owner; tenant B's thread t:
    b0 <- b1 (the head)."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        for tenant, ids in (("A", ("p0", "p1")), ("B", ("b0", "b1"))):
            owner.execute(PUT_FAST, fast_params(ids[0], None, tenant=tenant, md=json.dumps(
                {"source": "input", "step": -1})))
            owner.execute(PUT_FAST, fast_params(ids[1], ids[0], tenant=tenant))
    return dsn


@pytest.fixture
def fast_path_worker(fast_path_world: str, make_role: Callable[..., str]) -> str:
    """A LOGIN role in replaysafe_worker bound to tenant A, over ``fast_path_world``."""
    role = make_role("replaysafe_worker")
    bind(fast_path_world, role, "A")
    return role
