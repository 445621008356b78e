"""Alembic environment for `alembic upgrade head` with replaysafe_pg's own alembic.ini.

The work is done by replaysafe_pg.schema so that the same code serves the Python call
(`replaysafe_pg.migrate(dsn)`) and a user's own alembic env.
"""

from alembic import context

from replaysafe_pg.schema import run_from_alembic_env

run_from_alembic_env(context)
