"""Versioned thread state: tables, functions, view, row-level security and grants.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0002_threads.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0002_threads.down.sql", connection)
