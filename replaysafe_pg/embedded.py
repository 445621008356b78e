"""``replaysafe_pg.embedded``: the embedded Postgres of the command line, for your own code
and tests (it lives in :mod:`replaysafe_pg.cli.embedded`)."""

from replaysafe_pg.cli.embedded import (
    EmbeddedServer,
    default_pgdata,
    running_pid,
    start,
    stop,
    stop_pid,
)

__all__ = ["EmbeddedServer", "default_pgdata", "running_pid", "start", "stop", "stop_pid"]
