"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from replaysafe_pg.schema import run_revision

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


# The SQL files hold DDL and data only (tables, indexes, DROP FUNCTION of a changed
# signature, repairs); the function set of the revision a step arrives at is applied after
# them (docs/migrations.md).
def upgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "${up_revision}_CHANGE_ME.sql", connection, arrives_at=revision)


def downgrade(connection: Connection | None = None) -> None:
    run_revision(__file__, "${up_revision}_CHANGE_ME.down.sql", connection,
                 arrives_at=${repr(down_revision)})
