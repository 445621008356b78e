"""What readers need: the installed revision for every replaysafe role (doctor and
``migrate current`` as a worker or an auditor); multi_effect_actions bounded by the tenant.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0004_readers.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0004_readers.down.sql", connection)
