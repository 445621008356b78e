"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "${up_revision}_CHANGE_ME.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "${up_revision}_CHANGE_ME.down.sql", connection)
