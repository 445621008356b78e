"""The tenant check's common case inline in the hot functions, under "C" collation; a static probe.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0008_tenant_check.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0008_tenant_check.down.sql", connection)
