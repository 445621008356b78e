"""Execution, the value run() returns."""

from __future__ import annotations

from replaysafe_pg import (
    Execution,
)


def test_execution_is_a_plain_dataclass() -> None:
    ex = Execution("succeeded", 1, None, False, 1, "rs1_x", "k", "op")  # type: ignore[arg-type]
    assert ex.unwrap() == 1 and not ex.superseded
