"""``replaysafe_pg.embedded``: the embedded Postgres of the command line, for your own code
and tests (it lives in :mod:`replaysafe_pg.cli.embedded`).

``serve()`` is ``replaysafe-pg server start`` (detached, migrated, recorded), ``unserve()``
is ``server stop``, ``server_status()`` is ``server status``; ``start()`` / ``stop()`` give a
server tied to this process and do not migrate.
"""

from replaysafe_pg.cli.embedded import (
    STATE_FILE,
    EmbeddedServer,
    ServerStatus,
    default_pgdata,
    postmasters_of,
    running_pid,
    serve,
    server_status,
    start,
    stop,
    stop_pid,
    unserve,
)

__all__ = ["STATE_FILE", "EmbeddedServer", "ServerStatus", "default_pgdata", "postmasters_of",
           "running_pid", "serve", "server_status", "start", "stop", "stop_pid", "unserve"]
