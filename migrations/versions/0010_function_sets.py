"""No table changes: from here on each step applies the function set of the revision it arrives at.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0010_function_sets.sql", connection, arrives_at=revision)


def downgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0010_function_sets.down.sql", connection, arrives_at="0009")
