"""The action ledger: tables, functions, views, row-level security and group roles.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0001_ledger.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0001_ledger.down.sql", connection)
