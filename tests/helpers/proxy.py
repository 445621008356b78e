"""A TCP proxy on 127.0.0.1 in front of a Postgres, for the fault tests: it cuts every
connection, refuses new ones for a while, or drops the next answer of the server (the
statement ran and committed; its answer never reaches the client).

Threads, one pair per connection; the upstream is a TCP address or a Unix socket (the
session's embedded server listens on one).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo


def upstream_of(dsn: str) -> tuple[str, int]:
    """Where ``dsn`` connects: (host or socket directory, port)."""
    info = conninfo_to_dict(dsn)
    return str(info.get("host") or "/tmp"), int(info.get("port") or 5432)


class Proxy:
    def __init__(self, dsn: str) -> None:
        self.target = upstream_of(dsn)
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(256)
        self.port: int = self._server.getsockname()[1]
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=str(self.port), connect_timeout="3")
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._refuse_until = 0.0
        self._drop_answers = 0
        self._closed = False
        self.cuts = 0
        self.refused = 0
        self.dropped_answers = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    # --- faults ---------------------------------------------------------------------------

    def cut(self) -> int:
        """Close every open connection (both ends) at once; how many there were."""
        with self._lock:
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            _close(pair)
        self.cuts += len(pairs)
        return len(pairs)

    def refuse(self, seconds: float) -> None:
        """Cut every connection and refuse new ones for ``seconds``."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds
        self.cut()

    def drop_next_answer(self, count: int = 1) -> None:
        """The server's next ``count`` answers (on any connection) are dropped and their
        connections cut: the statements ran, their answers are lost."""
        with self._lock:
            self._drop_answers += count

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        self.cut()

    # --- plumbing -------------------------------------------------------------------------

    def _connect_upstream(self) -> socket.socket:
        host, port = self.target
        if host.startswith("/"):
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(str(Path(host) / f".s.PGSQL.{port}"))
            return up
        return socket.create_connection((host, port), timeout=3)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                refusing = time.monotonic() < self._refuse_until
            if refusing:
                self.refused += 1
                _close((client,))
                continue
            try:
                upstream = self._connect_upstream()
                upstream.settimeout(None)
            except OSError:
                _close((client,))
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(pair, client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, upstream, client, True),
                             daemon=True).start()

    def _pump(self, pair: tuple[socket.socket, socket.socket], src: socket.socket,
              dst: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_server and self._take_drop():
                    self.dropped_answers += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._pairs.discard(pair)
        _close(pair)

    def _take_drop(self) -> bool:
        with self._lock:
            if self._drop_answers > 0:
                self._drop_answers -= 1
                return True
            return False


def _close(sockets: tuple[socket.socket, ...]) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()
