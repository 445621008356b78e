"""SQLAlchemy Core tables for the audit views, to compose audit queries in your own code.

    import sqlalchemy as sa
    from replaysafe_pg.audit import actions_v, unresolved_actions

    stuck = sa.select(unresolved_actions).where(unresolved_actions.c.age > sa.text("interval '1 hour'"))
    refunds = (sa.select(actions_v.c.state, sa.func.count())
               .where(actions_v.c.operation == "refund").group_by(actions_v.c.state))

The views are read-only and apply the reader's row-level security: a role bound to a tenant
sees that tenant's rows only. A test reflects the database and keeps these definitions equal
to the views.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from replaysafe_pg.models import ActionState

metadata = sa.MetaData(schema="replaysafe")

# The database's enum type; never created or dropped from here (the migrations own it).
action_state = postgresql.ENUM(*[s.value for s in ActionState], name="action_state",
                               schema="replaysafe", create_type=False)


def _ts(name: str) -> sa.Column[object]:
    return sa.Column(name, postgresql.TIMESTAMP(timezone=True))


actions_v = sa.Table(
    "actions_v", metadata,
    sa.Column("tenant_id", sa.Text),
    sa.Column("action_key", sa.Text),
    sa.Column("thread_id", sa.Text),
    sa.Column("operation", sa.Text),
    sa.Column("state", action_state),
    sa.Column("attempt", sa.Integer),
    sa.Column("on_expired", sa.Text),
    sa.Column("idempotency_key", sa.Text),
    sa.Column("request", postgresql.JSONB),
    sa.Column("result", postgresql.JSONB),
    sa.Column("error", postgresql.JSONB),
    sa.Column("provider_reference", sa.Text),
    _ts("lease_expires_at"),
    _ts("created_at"),
    _ts("updated_at"),
    _ts("completed_at"),
    sa.Column("worker_id", sa.Text),
    sa.Column("resolution_note", sa.Text),
    _ts("resolved_at"),
    comment="One row per action (replaysafe.actions_v).",
)

action_attempts_v = sa.Table(
    "action_attempts_v", metadata,
    sa.Column("tenant_id", sa.Text),
    sa.Column("action_key", sa.Text),
    sa.Column("attempt", sa.Integer),
    sa.Column("worker_id", sa.Text),
    _ts("claimed_at"),
    _ts("ended_at"),
    sa.Column("outcome", action_state),
    sa.Column("superseded", sa.Boolean),
    sa.Column("error", postgresql.JSONB),
    sa.Column("result", postgresql.JSONB),
    sa.Column("provider_reference", sa.Text),
    comment="One row per attempt (replaysafe.action_attempts_v); outcome is NULL while running.",
)

unresolved_actions = sa.Table(
    "unresolved_actions", metadata,
    sa.Column("tenant_id", sa.Text),
    sa.Column("action_key", sa.Text),
    sa.Column("operation", sa.Text),
    sa.Column("state", action_state),
    _ts("lease_expires_at"),
    sa.Column("age", postgresql.INTERVAL),
    sa.Column("thread_id", sa.Text),
    _ts("created_at"),
    _ts("updated_at"),
    comment="Unknown actions and running ones whose lease expired.",
)

multi_effect_actions = sa.Table(
    "multi_effect_actions", metadata,
    sa.Column("tenant_id", sa.Text),
    sa.Column("action_key", sa.Text),
    sa.Column("operation", sa.Text),
    sa.Column("successful_attempts", sa.BigInteger),
    comment="Actions with more than one attempt that reported success.",
)

__all__ = ["action_attempts_v", "action_state", "actions_v", "metadata", "multi_effect_actions",
           "unresolved_actions"]
