"""Fixtures of the fault suite: a proxy in front of the session's Postgres, and a Postgres of
its own that the crash tests stop and restart (never the session's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.faults import PgServer
from helpers.proxy import Proxy


@pytest.fixture
def proxy(dsn: str) -> Iterator[Proxy]:
    p = Proxy(dsn)
    yield p
    p.close()


@pytest.fixture(scope="module")
def crash_server() -> Iterator[PgServer]:
    server = PgServer()
    try:
        yield server
    finally:
        server.close()
