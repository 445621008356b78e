"""Attempt tokens: heartbeats and reports need the token of the attempt; claim tokens kept as hashes.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0011_attempt_tokens.sql", connection, arrives_at=revision)


def downgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0011_attempt_tokens.down.sql", connection, arrives_at="0010")
