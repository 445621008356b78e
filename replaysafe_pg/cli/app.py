"""The whole ``replaysafe-pg`` command: the root group of :mod:`replaysafe_pg.cli.plumbing`
with the commands of every command module added (``replaysafe_pg.cli.main``, the console
script)."""

from __future__ import annotations

from replaysafe_pg.cli.action_commands import actions, audit, purge, reopen, resolve, sweep
from replaysafe_pg.cli.console_command import console
from replaysafe_pg.cli.demo_command import demo
from replaysafe_pg.cli.doctor import doctor
from replaysafe_pg.cli.grant_commands import grant
from replaysafe_pg.cli.metrics_commands import metrics
from replaysafe_pg.cli.migrate_commands import migrate
from replaysafe_pg.cli.plumbing import main, parse_duration
from replaysafe_pg.cli.reconcile_loop import reconcile
from replaysafe_pg.cli.server_commands import server
from replaysafe_pg.cli.thread_commands import threads

__all__ = ["main", "parse_duration"]

for _command in (migrate, doctor, actions, audit, resolve, sweep, purge, reconcile, reopen,
                 threads, demo, server, grant, metrics, console):
    main.add_command(_command)
