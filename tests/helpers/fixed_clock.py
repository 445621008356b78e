"""A fixed clock for the ledger's p_now (no sleeps): ``T0`` and ``at(seconds)`` after it, and
the lease the tests claim with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


LEASE = timedelta(seconds=30)  # the lease of a claim, in the tests that claim with one


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)
