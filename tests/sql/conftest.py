"""Fixtures of the sql tier."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as


@pytest.fixture
def worker_a(world: str, make_role: Callable[..., str]) -> Iterator[psycopg.Connection[Any]]:
    """A LOGIN role in replaysafe_worker bound to tenant A, connected, over the module's
    own `world` (each module seeds its tenants its way)."""
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    with connect_as(world, role) as c:
        yield c
