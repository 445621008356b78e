"""Operability: metrics() for scrapers, purge_threads() for retention, the indexes they read.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0014_operability.sql", connection, arrives_at=revision)


def downgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0014_operability.down.sql", connection, arrives_at="0013")
