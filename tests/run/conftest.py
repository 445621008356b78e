"""Fixtures of the run tier: the payment provider on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.run import Provider


@pytest.fixture
def provider() -> Iterator[Provider]:
    p = Provider().start()
    yield p
    p.stop()
