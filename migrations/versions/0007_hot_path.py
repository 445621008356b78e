"""The hot path: a first attempt gets its own attempt row only when something else needs it.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0007_hot_path.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0007_hot_path.down.sql", connection)
