"""Tenant grants: signed capabilities that let one pooled login act for many tenants.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0012_tenant_grants.sql", connection, arrives_at=revision)


def downgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "0012_tenant_grants.down.sql", connection, arrives_at="0011")
