"""Arguments just past the bounds the schema enforces, for the bad-input tests (tests/sql:
ledger/test_ledger_bad_input.py, threads/test_thread_bad_input.py)."""

from __future__ import annotations

LONG = "x" * 513  # an id one byte over the 512 bytes an id may take
