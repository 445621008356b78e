"""``python -m replaysafe_pg.cli``: the ``replaysafe-pg`` command."""

from replaysafe_pg.cli.app import main

main()
