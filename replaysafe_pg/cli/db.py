"""Which database a command talks to: ``--dsn`` / ``REPLAYSAFE_DSN``, else an embedded one.

The embedded server is for newcomers: ``pip install`` and run. It keeps its data under a
per-user directory (``--pgdata`` to choose another), is migrated to head on first use, and
is stopped again when the command ends if the command started it (and ``server start`` did
not adopt it meanwhile). ``--ephemeral`` uses a throwaway data directory under /tmp that is
deleted afterwards, also when SIGTERM arrives while the server starts or stops: those steps
finish first, then the command unwinds (see :func:`sigterm_deferred`).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from replaysafe_pg import embedded, schema
from replaysafe_pg._conn import connectable, open_connection
from replaysafe_pg._dsn import redact
from replaysafe_pg.errors import InvalidArgument


class ConnectError(Exception):
    """The database cannot be reached (bad DSN, server down, authentication...)."""


class Database:
    def __init__(self, *, dsn: str | None, pgdata: Path | None, ephemeral: bool,
                 notice: Callable[[str], None]) -> None:
        self._dsn = dsn
        self._pgdata = pgdata
        self._ephemeral = ephemeral
        self._notice = notice
        self._server: embedded.EmbeddedServer | None = None
        self._stop_at_close = False
        self._tmpdir: Path | None = None

    @property
    def embedded(self) -> bool:
        return self._dsn is None

    def dsn(self) -> str:
        """The DSN to use; starts (and migrates) the embedded server on first call."""
        if self._dsn is not None:
            return self._dsn
        if self._server is None:
            self._start_embedded()
        assert self._server is not None
        return self._server.dsn

    def _start_embedded(self) -> None:
        # A SIGTERM now would leave a half-started server (or its directory) behind.
        with sigterm_deferred():
            self._start_embedded_shielded()

    def _start_embedded_shielded(self) -> None:
        if self._ephemeral:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="replaysafe-pg-", dir="/tmp"))
            pgdata = self._tmpdir / "pgdata"
        else:
            pgdata = (self._pgdata or embedded.default_pgdata()).expanduser().resolve()
        already = embedded.running_pid(pgdata) if pgdata.exists() else None
        if already is None:
            self._notice(f"starting embedded Postgres (data in {pgdata}) ...")
        try:
            self._server = embedded.start(pgdata)
        except Exception as exc:
            self.close()
            raise ConnectError(f"could not start the embedded Postgres in {pgdata}: {exc}") from exc
        # Leave a server we found running alone: another command may be using it.
        self._stop_at_close = already is None or self._ephemeral
        current = schema.current_revision(self._server.dsn)
        if current != schema.head_revision():
            self._notice(f"migrating the embedded database to {schema.head_revision()} ...")
            schema.migrate(self._server.dsn)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        dsn = self.dsn()
        try:
            return open_connection(connectable(dsn), given=(dsn,), autocommit=True,
                                   prepare_threshold=None, **kwargs)
        except (psycopg.Error, InvalidArgument) as exc:  # InvalidArgument: a DSN libpq cannot read
            # Both already say nothing of the password; redacted again all the same.
            raise ConnectError(
                f"cannot connect to the database: {redact(first_line(exc), dsn)}") from exc

    @contextlib.contextmanager
    def connection(self, **kwargs: Any) -> Iterator[psycopg.Connection[Any]]:
        with self.connect(**kwargs) as conn:
            yield conn

    def close(self) -> None:
        with sigterm_deferred():
            server, self._server = self._server, None
            if (server is not None and self._stop_at_close
                    and not (self._tmpdir is None and embedded.is_served(server.pgdata, server.pid))):
                embedded.stop(server)
            if self._tmpdir is not None:
                # Also a postmaster whose start was cut short before it was ours to stop.
                for pid in embedded.postmasters_of(self._tmpdir / "pgdata"):
                    embedded.stop_pid(pid)
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold SIGTERM back for the block (starting or stopping a server, deleting its
    directory), then deliver it to the handler that was in place. Only in the main thread,
    where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if pending:
            if callable(previous):
                previous(signal.SIGTERM, None)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGTERM)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
