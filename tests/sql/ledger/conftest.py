"""Fixtures shared by the ledger tests (tests/sql/ledger)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.db import cloned_database


@pytest.fixture(scope="module")
def shared_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """One migrated database for the module (its tests empty the ledger between them)."""
    with cloned_database(admin_dsn, template_db) as dsn:
        yield dsn
