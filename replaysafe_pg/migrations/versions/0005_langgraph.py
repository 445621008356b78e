"""The LangGraph checkpointers' tables and functions (replaysafe_pg.langgraph).

Revision ID: 0005_langgraph
Revises: 0004
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0005_langgraph"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0005_langgraph.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0005_langgraph.down.sql", connection)
