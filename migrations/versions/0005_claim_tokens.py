"""Claim tokens: a claim whose answer was lost can be asked for again (SPEC §2).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision_sql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0005_claim_tokens.sql", connection)


def downgrade(connection: Connection | None = None) -> None:
    run_revision_sql(__file__, "0005_claim_tokens.down.sql", connection)
