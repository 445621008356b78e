"""langgraph_put's common case (parent = head) in fewer statements; delete_for_runs waits.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0009_langgraph_put.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0009_langgraph_put.down.sql", connection)
