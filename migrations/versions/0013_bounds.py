"""Bounds: size limits, all-tenant roles named explicitly, round-robin shared machinery.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0013_bounds.sql", connection, arrives_at=revision)


def downgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0013_bounds.down.sql", connection, arrives_at="0012")
