"""The LangGraph checkpointers' tables and functions (replaysafe_pg.langgraph).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0006_langgraph.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0006_langgraph.down.sql", connection)
