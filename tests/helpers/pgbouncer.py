"""A real PgBouncer (Debian's package) in front of the test server, on loopback.

PgBouncer refuses to run as root: as root it runs as the owner of the server's socket
directory (it must reach the socket), else as ``nobody``; otherwise as the current user.
Its settings are PgBouncer's defaults but for what a test must set: where to listen, the
pool mode, the pool size, and trust authentication of the logins the test names (each is
added to the auth file and PgBouncer reloaded).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def available() -> bool:
    return shutil.which("pgbouncer") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run_as(host: str) -> str | None:
    """The OS user PgBouncer runs as (None: this one)."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "nobody"


class PgBouncer:
    """One PgBouncer process; :meth:`dsn` is a DSN through it."""

    def __init__(self, admin_dsn: str, *, pool_mode: str, pool_size: int) -> None:
        server = conninfo_to_dict(admin_dsn)
        self.admin_user = str(server.get("user") or "postgres")
        host = str(server.get("host") or "/tmp")
        port = str(server.get("port") or "5432")
        self.pool_mode = pool_mode
        self.port = _free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="replaysafe-pgbouncer-", dir="/tmp"))
        self._users = {self.admin_user}
        user = _run_as(host)
        self._as = [] if user is None else ["runuser", "-u", user, "--"]
        (self._dir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self._dir}/userlist.txt
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 500
logfile = {self._dir}/pgbouncer.log
pidfile = {self._dir}/pgbouncer.pid
""")
        self._write_users()
        if user is not None:
            shutil.chown(self._dir, user)
            for f in self._dir.iterdir():
                shutil.chown(f, user)
        self._proc = subprocess.Popen([*self._as, "pgbouncer", str(self._dir / "pgbouncer.ini")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_for(self.admin_user)

    def _write_users(self) -> None:
        path = self._dir / "userlist.txt"
        path.write_text("".join(f'"{u}" ""\n' for u in sorted(self._users)))
        with contextlib.suppress(OSError):
            path.chmod(0o644)

    def _wait_for(self, user: str, dbname: str = "postgres") -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(self.dsn(dbname, user), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise RuntimeError(f"PgBouncer did not let {user} in: {self.log()}") from None
                time.sleep(0.05)

    def allow(self, user: str) -> None:
        """Let the LOGIN role ``user`` in (PgBouncer reloads its auth file)."""
        if user in self._users:
            return
        self._users.add(user)
        self._write_users()
        os.kill(self._pid(), signal.SIGHUP)
        self._wait_for(user)

    def _pid(self) -> int:
        return int((self._dir / "pgbouncer.pid").read_text().strip())

    def dsn(self, dbname: str, user: str) -> str:
        return make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user=user)

    def through(self, direct_dsn: str) -> str:
        """``direct_dsn``'s database and user, through PgBouncer."""
        params = conninfo_to_dict(direct_dsn)
        user = str(params.get("user") or self.admin_user)
        self.allow(user)
        return self.dsn(str(params["dbname"]), user)

    def log(self) -> str:
        try:
            return (self._dir / "pgbouncer.log").read_text()[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            os.kill(self._pid(), signal.SIGTERM)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def running(admin_dsn: str, *, pool_mode: str, pool_size: int = 20) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(admin_dsn, pool_mode=pool_mode, pool_size=pool_size)
    try:
        yield bouncer
    finally:
        bouncer.stop()
