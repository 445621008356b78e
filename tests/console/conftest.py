"""Fixtures of the console tests: a seeded database and consoles started on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from helpers.console import HOSTILE, Served, start_console

import replaysafe_pg


@pytest.fixture
def seeded(dsn: str) -> str:
    with replaysafe_pg.Ledger(dsn, tenant_id="acme", worker_id="w1") as led:
        led.claim(HOSTILE, "refund", {"order": 42}, lease=0.05)
        failed = led.claim("charge-9", "charge", {"cents": 100})
        led.fail(failed, {"code": "card_declined"})
    time.sleep(0.1)
    with replaysafe_pg.Ledger(dsn) as led:
        assert led.sweep() == 1
    return dsn


@pytest.fixture
def console_for(seeded: str) -> Iterator[Callable[[str], Served]]:
    started: list[Served] = []

    def start(dsn: str) -> Served:
        served = start_console(dsn)
        started.append(served)
        return served

    yield start
    for served in started:
        if served.proc.poll() is None:
            served.proc.kill()
        served.proc.wait(10)


