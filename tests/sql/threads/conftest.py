"""Fixtures shared by the thread tests (tests/sql/threads)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replaysafe_pg import Threads


@pytest.fixture
def threads(dsn: str) -> Iterator[Threads]:
    """The driver's Threads of tenant t1 on the test's database."""
    with Threads(dsn, tenant_id="t1") as th:
        yield th
