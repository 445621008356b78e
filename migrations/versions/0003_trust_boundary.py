"""The trust boundary: definer functions with a pinned search_path, no table privileges for
any group role, owner-rights views filtered by the caller's tenant, replaysafe_operator,
salted idempotency keys, time and id bounds.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0003_trust_boundary.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0003_trust_boundary.down.sql", connection)
